"""Numbers in words: every figure a specialist quotes carries its unit."""

from __future__ import annotations


def gib(v: float) -> str:
    return f"{v:.2f} GiB" if abs(v) >= 1 else f"{v * 1024:.0f} MiB"


def mib(v: float) -> str:
    return f"{v:.1f} MiB" if abs(v) < 100 else f"{v:.0f} MiB"


def pct(fraction: float) -> str:
    """0.62 -> '62%'; 0.001 -> '0.1%'."""
    if 0 < abs(fraction) < 0.01:
        return f"{fraction * 100:.1f}%"
    return f"{fraction * 100:.0f}%"


def secs(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s"


def ms(v: float) -> str:
    return f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


def count(n: float, word: str, plural: str | None = None) -> str:
    """count(3, 'step') -> '3 steps'; count(1, 'step') -> '1 step'."""
    n = int(n)
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def sci(v: float) -> str:
    """Magnitudes that span orders: 1.2e+04, 3.5e-07; plain below 1000."""
    return f"{v:.3g}" if 1e-3 <= abs(v) < 1e4 or v == 0 else f"{v:.1e}"


def listing(items: list[str], limit: int = 4) -> str:
    """'`a`, `b` and `c`' (and 'and 3 more' past `limit`)."""
    shown = [f"`{x}`" for x in items[:limit]]
    rest = len(items) - len(shown)
    if rest > 0:
        shown.append(f"{rest} more")
    if len(shown) == 1:
        return shown[0]
    return ", ".join(shown[:-1]) + " and " + shown[-1]

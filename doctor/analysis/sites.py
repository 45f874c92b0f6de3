"""Small readers the protocol analyses share: a probe's `site` field as a Location, the latest event of a kind."""

from __future__ import annotations

from typing import Any

from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.model import Location


def location(run: RunEvidence, site: dict[str, Any] | None) -> Location | None:
    """`{"path", "line", "function"}` as written by probes/sites.py -> a Location with the source line."""
    if not site or not site.get("path"):
        return None
    return run.location(site["path"], site.get("line"), site.get("function"))


def latest(run: RunEvidence, probe: str, *kinds: str, rank: int = 0) -> dict[str, Any] | None:
    """The last event of any of `kinds` (e.g. a final summary, else the last progress report)."""
    for kind in kinds:
        found = run.of_kind(kind, probe, rank)
        if found:
            return found[-1]
    return None


def plural(n: int | float, one: str, many: str | None = None) -> str:
    n = int(n)
    return f"{n} {one if n == 1 else (many or one + 's')}"

"""Series -> inline SVG charts for the HTML report: line charts over optimizer steps, and bar charts.

Hand-written on purpose (docs/html-report.md says why): static SVG needs no
script, so the report opens offline, in a mail attachment or with scripts
blocked, prints, and can be tested as XML. Each chart is an `<svg role="img">`
with a `<title>` and a `<desc>` that says in words what it shows (the range,
the first and last values, the marked steps), so a screen reader gets the
numbers and not a picture.

Long runs are thinned to at most `MAX_POINTS` points per line, keeping each
bucket's lowest and highest value, so a one-step spike survives the thinning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

MAX_POINTS = 800  # per line; a path point costs ~12 bytes
WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 40  # plot margins: y tick labels left, x tick labels and axis title below
# Okabe & Ito's palette: told apart by people with the common colour-vision deficiencies.
COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442")
MARK_COLOUR = "#c00000"


@dataclass
class Line:
    label: str
    xs: list[float]
    ys: list[float]
    dashed: bool = False


@dataclass
class Chart:
    """A line chart over optimizer steps. `marks`: steps to flag (non-finite values), drawn as a red band."""

    title: str
    y_label: str
    lines: list[Line]
    x_label: str = "optimizer step"
    marks: list[int] = field(default_factory=list)
    mark_label: str = "not finite"
    log_y: bool = False


def fmt(value: float) -> str:
    """A number short enough for an axis: 1.28e-4, 0.0125, 12.5, 3,200, 1.5e7."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e6 or magnitude < 1e-2:
        mantissa, exponent = f"{value:.2e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 × 10^k steps) covering lo..hi."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 12))
    return ticks


def thin(xs: list[float], ys: list[float], limit: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most ~`limit` points in order: each bucket keeps its lowest and its highest value."""
    n = len(xs)
    if n <= limit:
        return list(xs), list(ys)
    buckets = max(1, limit // 2)
    out_x: list[float] = []
    out_y: list[float] = []
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo >= hi:
            continue
        idx = range(lo, hi)
        low = min(idx, key=ys.__getitem__)
        high = max(idx, key=ys.__getitem__)
        for i in sorted({low, high}):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y


def ranges(steps: list[int]) -> list[tuple[int, int]]:
    """Sorted steps as runs of consecutive ones: [3, 4, 5, 9] -> [(3, 5), (9, 9)]."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(steps)):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def describe(chart: Chart) -> str:
    """The chart in one sentence: what a screen reader reads, and the text under a chart in tests."""
    parts = []
    for line in chart.lines:
        if not line.ys:
            continue
        lo, hi = min(line.ys), max(line.ys)
        parts.append(f"{line.label}: {len(line.ys)} points, steps {fmt(line.xs[0])}–{fmt(line.xs[-1])}, "
                     f"first {fmt(line.ys[0])}, last {fmt(line.ys[-1])}, range {fmt(lo)} to {fmt(hi)}")
    if chart.marks:
        runs = ranges(chart.marks)
        shown = ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs[:6]) + (", …" if len(runs) > 6 else "")
        parts.append(f"{chart.mark_label} at {len(set(chart.marks))} step{'s' if len(set(chart.marks)) != 1 else ''} "
                     f"({shown})")
    return f"{chart.title} ({chart.y_label}). " + "; ".join(parts) + "."


def line_chart(chart: Chart, chart_id: str) -> str:
    """The chart as an inline `<svg>`; `chart_id` makes its title and description ids unique in the page."""
    log = chart.log_y and all(y > 0 for line in chart.lines for y in line.ys)
    lines = [Line(line.label, *thin(line.xs, line.ys), dashed=line.dashed) for line in chart.lines if line.ys]
    xs = [x for line in lines for x in line.xs] + list(chart.marks)
    ys = [math.log10(y) if log else y for line in lines for y in line.ys]
    if not xs:
        return ""
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    if ys:
        y_lo, y_hi = min(ys), max(ys)
    else:
        y_lo, y_hi = 0.0, 1.0
    if log:
        y_ticks = [float(p) for p in range(math.floor(y_lo), math.ceil(y_hi) + 1)]
        if len(y_ticks) < 2:
            y_ticks = [y_ticks[0], y_ticks[0] + 1] if y_ticks else [0.0, 1.0]
    else:
        if y_lo > 0 and y_lo < 0.25 * y_hi:
            y_lo = 0.0  # a series that stays positive reads better from zero, unless it hovers far above it
        y_ticks = nice_ticks(y_lo, y_hi)
    x_ticks = [t for t in nice_ticks(x_lo, x_hi, 6) if x_lo <= t <= x_hi] or [x_lo, x_hi]
    y_lo, y_hi = min(y_ticks[0], y_lo), max(y_ticks[-1], y_hi)
    if y_hi == y_lo:
        y_hi = y_lo + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    title_id, desc_id = f"{chart_id}-title", f"{chart_id}-desc"
    out = [
        f'<svg class="chart" id="{chart_id}" role="img" aria-labelledby="{title_id} {desc_id}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg" '
        'font-family="sans-serif" font-size="11">',
        f'<title id="{title_id}">{escape(chart.title)}</title>',
        f'<desc id="{desc_id}">{escape(describe(chart))}</desc>',
        f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#bbb"/>',
    ]
    for t in y_ticks:
        y = py(t)
        label = fmt(10 ** t) if log else fmt(t)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#333">{label}</text>')
    for t in x_ticks:
        x = px(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 4}" stroke="#888"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" fill="#333">{fmt(t)}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 4}" text-anchor="middle" fill="#333">'
               f'{escape(chart.x_label)}</text>')
    out.append(f'<text transform="translate(12 {TOP + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle" '
               f'fill="#333">{escape(chart.y_label)}{" (log scale)" if log else ""}</text>')
    for a, b in ranges(chart.marks):
        x0, x1 = px(a - 0.5), px(b + 0.5)
        x0, x1 = max(LEFT, x0), min(LEFT + plot_w, x1)
        out.append(f'<rect class="mark" x="{x0:.1f}" y="{TOP}" width="{max(x1 - x0, 1.5):.1f}" height="{plot_h}" '
                   f'fill="{MARK_COLOUR}" fill-opacity="0.18"/>')
        out.append(f'<rect x="{x0:.1f}" y="{TOP + plot_h - 6}" width="{max(x1 - x0, 1.5):.1f}" height="6" '
                   f'fill="{MARK_COLOUR}"/>')
    for i, line in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{px(x):.1f},{py(math.log10(y) if log else y):.1f}" for x, y in zip(line.xs, line.ys,
                                                                                                strict=True))
        dash = ' stroke-dasharray="6 3"' if line.dashed else ""
        if len(line.xs) == 1:
            x, y = line.xs[0], line.ys[0]
            out.append(f'<circle class="series" cx="{px(x):.1f}" cy="{py(math.log10(y) if log else y):.1f}" r="3" '
                       f'fill="{colour}"/>')
        else:
            out.append(f'<polyline class="series" points="{points}" fill="none" stroke="{colour}" '
                       f'stroke-width="1.6"{dash}/>')
    out.append("</svg>")
    return "\n".join(out)


def legend(chart: Chart) -> str:
    """The chart's key as HTML (below the SVG, so it wraps with the page and is plain text to copy)."""
    items = []
    drawn = [line for line in chart.lines if line.ys]
    for i, line in enumerate(drawn):
        style = "dashed" if line.dashed else "solid"
        items.append(f'<span class="key"><span class="swatch" style="border-top: 3px {style} '
                     f'{COLOURS[i % len(COLOURS)]}"></span>{escape(line.label)}</span>')
    if chart.marks:
        items.append(f'<span class="key"><span class="swatch" style="border-top: 6px solid {MARK_COLOUR}"></span>'
                     f'{escape(chart.mark_label)} ({len(set(chart.marks))} steps)</span>')
    return f'<div class="legend">{"".join(items)}</div>' if items else ""


def bar_chart(title: str, bars: list[tuple[str, float]], unit: str, chart_id: str,
              highlight: set[str] | frozenset[str] = frozenset(), stacked: bool = False) -> str:
    """Horizontal bars, one per label (or one bar split into parts when `stacked`), with their values written."""
    if not bars:
        return ""
    total = sum(v for _, v in bars)
    top = max((v for _, v in bars), default=0.0)
    row_h = 26
    height = TOP + (row_h if stacked else row_h * len(bars)) + (BOTTOM if stacked else 12)
    label_w = 0 if stacked else 150
    plot_w = WIDTH - LEFT - RIGHT - label_w - (0 if stacked else 90)  # room for the value after the longest bar
    title_id, desc_id = f"{chart_id}-title", f"{chart_id}-desc"
    words = "; ".join(f"{label} {fmt(value)} {unit}" + (f" ({value / total:.0%})" if stacked and total else "")
                      for label, value in bars)
    out = [
        f'<svg class="chart bars" id="{chart_id}" role="img" aria-labelledby="{title_id} {desc_id}" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" xmlns="http://www.w3.org/2000/svg" '
        'font-family="sans-serif" font-size="11">',
        f'<title id="{title_id}">{escape(title)}</title>',
        f'<desc id="{desc_id}">{escape(title)}: {escape(words)}.</desc>',
    ]
    if stacked:
        x = float(LEFT)
        for i, (label, value) in enumerate(bars):
            w = plot_w * value / total if total else 0.0
            colour = COLOURS[i % len(COLOURS)]
            out.append(f'<rect class="series" x="{x:.1f}" y="{TOP}" width="{w:.1f}" height="{row_h - 6}" '
                       f'fill="{colour}"><title>{escape(label)}: {fmt(value)} {unit}</title></rect>')
            if w > 70:
                out.append(f'<text x="{x + 4:.1f}" y="{TOP + 14}" fill="#fff">{escape(label)} {value / total:.0%}</text>')
            x += w
        axis_y = TOP + row_h
        for t in nice_ticks(0, total, 6):
            if t > total:
                break
            tx = LEFT + plot_w * t / total if total else LEFT
            out.append(f'<text x="{tx:.1f}" y="{axis_y + 10}" text-anchor="middle" fill="#333">{fmt(t)}</text>')
        out.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle" fill="#333">'
                   f'{escape(unit)} per step</text>')
    else:
        for i, (label, value) in enumerate(bars):
            y = TOP + i * row_h
            w = plot_w * value / top if top else 0.0
            colour = MARK_COLOUR if label in highlight else COLOURS[0]
            out.append(f'<text x="{LEFT + label_w - 6}" y="{y + 14}" text-anchor="end" fill="#333">{escape(label)}</text>')
            out.append(f'<rect class="series" x="{LEFT + label_w}" y="{y}" width="{max(w, 1):.1f}" height="{row_h - 8}" '
                       f'fill="{colour}"/>')
            out.append(f'<text x="{LEFT + label_w + max(w, 1) + 4:.1f}" y="{y + 14}" fill="#333">{fmt(value)} '
                       f'{escape(unit)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def parts_legend(parts: list[tuple[str, float]], unit: str) -> str:
    """The key of a stacked bar: each part's colour, name, value and share (the narrow parts have no room inside)."""
    total = sum(v for _, v in parts) or 1.0
    items = [f'<span class="key"><span class="swatch" style="border-top: 8px solid {COLOURS[i % len(COLOURS)]}">'
             f"</span>{escape(label)} {fmt(value)} {escape(unit)} ({value / total:.0%})</span>"
             for i, (label, value) in enumerate(parts)]
    return f'<div class="legend">{"".join(items)}</div>'

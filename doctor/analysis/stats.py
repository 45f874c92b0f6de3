"""Robust statistics for step series: Theil–Sen slopes and "sustained growth".

A leak is a slope that holds: one noisy sample, a warm-up that plateaus or a
cache that fills once must not look like one. Theil–Sen (the median of all
pairwise slopes) ignores up to 29% wild points; "sustained" asks that the
last half of the window still grows at a good share of the whole window's
rate.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MAX_POINTS = 256  # pairwise slopes are O(n²): 256 points -> 32,640 pairs, ~10 ms


def thin(xs: list[float], ys: list[float], limit: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most `limit` points, evenly spaced, first and last kept."""
    n = len(xs)
    if n <= limit:
        return list(xs), list(ys)
    idx = sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})
    return [xs[i] for i in idx], [ys[i] for i in idx]


def theil_sen(xs: list[float], ys: list[float]) -> float | None:
    """Median of pairwise slopes (pairs with equal x skipped); None with fewer than 2 points."""
    xs, ys = thin(xs, ys)
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    ]
    return statistics.median(slopes) if slopes else None


@dataclass
class Growth:
    slope: float  # units per step over the whole window
    late_slope: float  # over the last half
    total: float  # slope × the window's length in steps
    first: float  # the series at the window's start and end (medians of the edge points)
    last: float
    from_step: int
    to_step: int
    points: int


def sustained_growth(
    xs: list[float],
    ys: list[float],
    *,
    after: float,
    min_points: int,
    min_slope: float,
    min_total: float,
    sustained_fraction: float,
) -> Growth | None:
    """The growth of `ys` over steps `xs` after step `after`, if it is real and still going."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if x > after]
    if len(pts) < min_points:
        return None
    wx = [p[0] for p in pts]
    wy = [p[1] for p in pts]
    slope = theil_sen(wx, wy)
    if slope is None or slope < min_slope:
        return None
    span = wx[-1] - wx[0]
    total = slope * span
    if total < min_total:
        return None
    half = len(wx) // 2
    late = theil_sen(wx[half:], wy[half:])
    if late is None or late < sustained_fraction * slope:
        return None
    edge = max(1, len(wy) // 8)
    return Growth(
        slope=slope,
        late_slope=late,
        total=total,
        first=statistics.median(wy[:edge]),
        last=statistics.median(wy[-edge:]),
        from_step=int(wx[0]),
        to_step=int(wx[-1]),
        points=len(wx),
    )

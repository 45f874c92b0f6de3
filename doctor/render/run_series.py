"""A run directory -> the per-step series the HTML report draws (data only; charts are svg_chart.py).

Everything here was measured and written by the probes; nothing is estimated. A
series the run did not record stays empty, and the page says "not measured".

Sources (see probes/evidence.py and probes/stepfile.py for the formats):
- `steps.rank<R>.jsonl` (or step events in `events.rank<R>.jsonl`): one record
  per optimizer step with its time `t` and each probe's per-step numbers:
  `nan.loss`, `nan.grad_norm` (`nan.grad_norm_step` when the norm belongs to an
  earlier step, on CUDA), `memory.rss_mib`, `memory.cuda_allocated_mib`,
  `memory.cuda_reserved_mib`, `data.wait_ms`, `distributed.local_ms`;
- the events: `profile` (the step-time split of the profiler window),
  `holders` (the variables that hold tensors or graphs, per scan),
  `grad-norms` (at each gradient check, the learning rate of the first parameter
  group, and `group_lrs`, every group's, when there are several), `scheduler-end`
  (the first group's learning rate after each `scheduler.step()`);
- `lr_curves.csv`: a scheduler's intended and projected curves (doctor/analysis/schedule.py).

Non-finite values (written as "nan"/"inf" strings, or NaN/Infinity numbers) are
kept apart as the steps where they happened, so a chart can mark them.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchdoctor.analysis.evidence import read_events

MAX_HOLDERS = 24  # holder names kept per run: the page draws only the ones a symptom names
SPLIT_PARTS = ("data", "forward", "backward", "optimizer")  # `<part>_ms` in the profile event; "other" is the rest


@dataclass
class Series:
    """One measured quantity per optimizer step: finite points, and the steps where it was not finite."""

    name: str
    unit: str = ""
    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)
    nonfinite: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.xs or self.nonfinite)

    def add(self, step: float, value: Any) -> None:
        number = as_number(value)
        if number is None:
            return
        if math.isfinite(number):
            self.xs.append(step)
            self.ys.append(number)
        else:
            self.nonfinite.append(int(step))


@dataclass
class Split:
    """Where a step's time went, measured by the profiler over steps `from_step`–`to_step` (ms per step)."""

    from_step: int
    to_step: int
    step_ms: float
    parts: list[tuple[str, float]]  # (data | forward | backward | optimizer | other, ms)


@dataclass
class RankSeries:
    """One rank's per-step numbers."""

    rank: int
    step_ms: Series  # the interval between consecutive optimizer steps
    local_ms: Series  # DDP: the rank's own work before the gradient all-reduce


@dataclass
class RunSeries:
    """What a run directory holds, per step. Empty series mean "not measured"."""

    loss: Series
    grad_norm: Series
    rss: Series
    cuda_allocated: Series
    cuda_reserved: Series
    step_ms: Series
    data_wait: Series
    lr: list[Series]  # measured: one per parameter group (or the first group only, where that is all recorded)
    lr_planned: list[Series]  # lr_curves.csv: each scheduler's intended and projected curve
    split: Split | None
    holders: dict[str, dict[str, Series]]  # variable -> graph_nodes | tensors | mib
    ranks: list[RankSeries]
    files: list[str]  # the run directory's files, by name


def as_number(value: Any) -> float | None:
    """A measured value as a float (inf/nan included), or None when it is no number at all."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity"):
        return float(value.strip().lower().replace("infinity", "inf"))
    return None


def read_run(run_dir: str | Path, events: dict[int, list[dict[str, Any]]] | None = None) -> RunSeries:
    """Every per-step series of a run directory (rank 0 for the single-rank charts, every rank for the timeline).
    `events`: what `read_events(run_dir)` returns, when the caller has read it already."""
    run_dir = Path(run_dir)
    events = read_events(run_dir) if events is None else events
    ranks = sorted(events) or [0]
    rows = events.get(ranks[0], [])
    steps = [e for e in rows if e.get("kind") == "step" and isinstance(e.get("step"), int)]
    return RunSeries(
        loss=probe_series(steps, "nan", "loss", "loss"),
        grad_norm=_grad_norm(steps),
        rss=probe_series(steps, "memory", "rss_mib", "RSS", "MiB"),
        cuda_allocated=probe_series(steps, "memory", "cuda_allocated_mib", "CUDA allocated", "MiB"),
        cuda_reserved=probe_series(steps, "memory", "cuda_reserved_mib", "CUDA reserved", "MiB"),
        step_ms=step_intervals(steps),
        data_wait=probe_series(steps, "data", "wait_ms", "data wait", "ms"),
        lr=_measured_lr(rows),
        lr_planned=_planned_lr(run_dir / "lr_curves.csv"),
        split=_split(rows),
        holders=_holders(rows),
        ranks=[_rank(rank, events[rank]) for rank in ranks if rank in events] if len(ranks) > 1 else [],
        files=sorted(p.name for p in run_dir.iterdir() if p.is_file()) if run_dir.is_dir() else [],
    )


def probe_series(steps: list[dict[str, Any]], probe: str, key: str, name: str, unit: str = "") -> Series:
    """A per-step number one probe returned from `after_step`, over the step records."""
    out = Series(name, unit)
    for e in steps:
        fields = e.get(probe)
        if isinstance(fields, dict) and key in fields:
            out.add(e["step"], fields[key])
    return out


def step_intervals(steps: list[dict[str, Any]]) -> Series:
    """Milliseconds from one optimizer step to the next (data, forward, backward and the optimizer together)."""
    out = Series("step time", "ms")
    for a, b in zip(steps, steps[1:], strict=False):
        ta, tb = as_number(a.get("t")), as_number(b.get("t"))
        if ta is not None and tb is not None and b["step"] > a["step"]:
            out.add(b["step"], round((tb - ta) * 1e3 / (b["step"] - a["step"]), 3))
    return out


def _grad_norm(steps: list[dict[str, Any]]) -> Series:
    """The total gradient norm, placed at the step it was measured for (`grad_norm_step` on CUDA)."""
    out = Series("gradient norm")
    for e in steps:
        fields = e.get("nan")
        if isinstance(fields, dict) and "grad_norm" in fields:
            at = fields.get("grad_norm_step")
            out.add(at if isinstance(at, int) else e["step"], fields["grad_norm"])
    return out


def _measured_lr(rows: list[dict[str, Any]]) -> list[Series]:
    """The learning rate the optimizer really had at each gradient check (the nan probe's `grad-norms` events):
    every parameter group's when there are several, else the first group's. Those events stop after the nan
    probe's `max_events`; the first group's after each `scheduler.step()` (the schedule probe's `scheduler-end`)
    covers the whole run, and is added where it goes on past the last check."""
    groups: list[Series] = []
    first = Series("group 0 (at each gradient check)")
    for e in rows:
        if e.get("kind") != "grad-norms" or not isinstance(e.get("at_step"), int):
            continue
        first.add(e["at_step"], e.get("lr"))
        for i, value in enumerate(e.get("group_lrs") or []):
            while len(groups) <= i:
                groups.append(Series(f"group {len(groups)}"))
            groups[i].add(e["at_step"], value)
    checked = groups or ([first] if first else [])
    stepped = Series("group 0 (after each scheduler.step())")
    for e in rows:
        if e.get("kind") == "scheduler-end" and isinstance(e.get("lrs"), list):
            for pair in e["lrs"]:
                if isinstance(pair, list) and len(pair) == 2:
                    stepped.add(pair[0], pair[1])
    last_check = max((s.xs[-1] for s in checked if s.xs), default=None)
    if stepped.xs and (last_check is None or stepped.xs[-1] > last_check):
        checked.append(stepped)
    return checked


def _planned_lr(path: Path) -> list[Series]:
    """lr_curves.csv: per scheduler, the curve it was built for (intended) and the one the script gives it."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    curves: dict[tuple[str, str], Series] = {}
    for row in rows:
        step = _csv_number(row.get("optimizer_step"))
        if step is None:
            continue
        for column, label in (("intended_lr", "intended"), ("projected_lr", "as stepped")):
            key = (row.get("scheduler", "?"), label)
            if key not in curves:
                curves[key] = Series(f"{row.get('kind') or 'scheduler'} {row.get('scheduler', '')} {label}".strip())
            curves[key].add(step, _csv_number(row.get(column)))
    return [s for s in curves.values() if s]


def _csv_number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _split(rows: list[dict[str, Any]]) -> Split | None:
    found = [e for e in rows if e.get("kind") == "profile" and as_number(e.get("step_ms"))]
    if not found:
        return None
    e = found[-1]
    step_ms = float(e["step_ms"])
    parts = [(part, float(e[f"{part}_ms"])) for part in SPLIT_PARTS if as_number(e.get(f"{part}_ms")) is not None]
    if not parts:
        return None
    parts.append(("other", max(0.0, step_ms - sum(ms for _, ms in parts))))
    return Split(int(e.get("from_step", 0)), int(e.get("to_step", 0)), step_ms, parts)


def _holders(rows: list[dict[str, Any]]) -> dict[str, dict[str, Series]]:
    out: dict[str, dict[str, Series]] = {}
    for e in rows:
        if e.get("kind") != "holders" or not isinstance(e.get("step"), int):
            continue
        for h in e.get("holders") or []:
            name = h.get("name") if isinstance(h, dict) else None
            if not isinstance(name, str):
                continue
            if name not in out:
                if len(out) >= MAX_HOLDERS:
                    continue
                out[name] = {"graph_nodes": Series("graph nodes"), "tensors": Series("tensors"),
                             "mib": Series("MiB", "MiB")}
            for key, series in out[name].items():
                if key in h:
                    series.add(e["step"], h[key])
    return out


def _rank(rank: int, rows: list[dict[str, Any]]) -> RankSeries:
    steps = [e for e in rows if e.get("kind") == "step" and isinstance(e.get("step"), int)]
    return RankSeries(rank, step_intervals(steps),
                      probe_series(steps, "distributed", "local_ms", "own work before the all-reduce", "ms"))

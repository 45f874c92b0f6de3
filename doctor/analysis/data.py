"""Classify the data probe's evidence: does the step wait on its DataLoader, and which one?

Reads the events of probes/data.py: one `dataloader` event per loader as
constructed (settings and call site), a `data` record in every step event
(the wait since the previous step), totals at the end. Thresholds in
rules/data/thresholds.toml, [data]. `data_wait` is shared with the profile
analysis, which raises the same symptom from its window when this probe did
not run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.model import Evidence, Location, Symptom

PROBE = "data"


@dataclass
class DataWait:
    fraction: float  # of the step time, over the window
    step_ms: float  # median step time in the window
    wait_ms: float  # median wait per step
    steps: int
    from_step: int
    to_step: int
    loader: int | None  # the loader the steps waited on most


def data_wait(run: RunEvidence, rank: int, lim: dict[str, Any]) -> DataWait | None:
    """The share of step time spent waiting on batches, after the warm-up steps."""
    steps = run.steps(rank)
    warm = int(lim.get("warmup_steps", 3))
    waits, times, loaders = [], [], []
    for prev, cur in zip(steps, steps[1:], strict=False):
        fields = cur.get(PROBE)
        if int(cur["step"]) <= warm or not isinstance(fields, dict):
            continue
        dt = float(cur["t"]) - float(prev["t"])
        if dt <= 0:
            continue
        waits.append(float(fields.get("wait_ms", 0.0)))
        times.append(dt * 1e3)
        if fields.get("loader") is not None:
            loaders.append(int(fields["loader"]))
    if len(times) < int(lim.get("min_steps", 5)):
        return None
    loader = max(set(loaders), key=loaders.count) if loaders else None
    return DataWait(
        fraction=sum(waits) / sum(times),
        step_ms=statistics.median(times),
        wait_ms=statistics.median(waits),
        steps=len(times),
        from_step=warm + 1,
        to_step=int(steps[-1]["step"]),
        loader=loader,
    )


def loaders(run: RunEvidence, rank: int) -> dict[int, dict[str, Any]]:
    return {int(e["index"]): e for e in run.of_kind("dataloader", PROBE, rank) if "index" in e}


def loader_location(run: RunEvidence, loader: dict[str, Any] | None) -> Location | None:
    if loader and loader.get("path") and loader.get("line"):
        return run.location(loader["path"], loader["line"], loader.get("function"))
    return None


def suggestions(settings: dict[str, Any], lim: dict[str, Any]) -> dict[str, Any]:
    """Settings to try: workers up to the CPUs this process may use, kept alive, prefetching."""
    cpus = settings.get("cpu_count") or 1
    workers = int(settings.get("num_workers") or 0)
    out: dict[str, Any] = {}
    target = min(int(lim.get("max_suggested_workers", 8)), max(cpus, 1))
    if workers < target:
        out["num_workers"] = target
    if (workers or out.get("num_workers")) and not settings.get("persistent_workers"):
        out["persistent_workers"] = True
    if not settings.get("pin_memory"):
        out["pin_memory"] = "True (when training on a GPU)"
    return out


def describe(settings: dict[str, Any]) -> str:
    keys = ("num_workers", "batch_size", "pin_memory", "persistent_workers", "prefetch_factor")
    return ", ".join(f"{k}={settings[k]}" for k in keys if k in settings)


def dataloader_symptom(run: RunEvidence, rank: int, wait: DataWait, lim: dict[str, Any], probe: str,
                       loader: dict[str, Any] | None, extra: dict[str, Any] | None = None) -> Symptom:
    settings = {k: v for k, v in (loader or {}).items()
                if k not in ("kind", "probe", "t", "step", "path", "line", "function", "pid")}
    values: dict[str, Any] = {
        "data_wait_fraction": round(wait.fraction, 4),
        "step_ms": round(wait.step_ms, 3),
        "data_wait_ms": round(wait.wait_ms, 3),
        "steps_observed": wait.steps,
        "from_step": wait.from_step,
        "to_step": wait.to_step,
    }
    for key in ("num_workers", "batch_size", "pin_memory", "persistent_workers", "prefetch_factor", "sampler",
                "dataset", "cpu_count"):
        if key in settings:
            values[key] = settings[key]
    if settings.get("cpu_count"):
        values["suggested_max_workers"] = settings["cpu_count"]
    suggested = suggestions(settings, lim) if settings else {}
    for key, value in suggested.items():
        values[f"suggested_{key}"] = value
    if extra:
        values.update(extra)
    summary = (f"the step waits on data {wait.fraction:.0%} of the time ({wait.wait_ms:.1f} ms of a "
               f"{wait.step_ms:.1f} ms step, median over steps {wait.from_step}–{wait.to_step})")
    if settings:
        summary += f"; the DataLoader has {describe(settings)}"
    if suggested:
        summary += "; try " + ", ".join(f"{k}={v}" for k, v in suggested.items())
    return run.symptom("dataloader-bound", probe=probe, summary=summary, values=values,
                       location=loader_location(run, loader), step=wait.to_step, rank=rank)


def bound(wait: DataWait | None, lim: dict[str, Any]) -> bool:
    return (wait is not None and wait.fraction >= float(lim.get("wait_fraction", 0.2))
            and wait.wait_ms >= float(lim.get("min_wait_ms", 1.0)))


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        wait = data_wait(run, rank, lim)
        found = loaders(run, rank)
        if bound(wait, lim):
            assert wait is not None
            loader = found.get(wait.loader) if wait.loader is not None else None
            out.symptoms.append(dataloader_symptom(run, rank, wait, lim, PROBE, loader))
        _rebuilt(run, rank, found, lim, out)
    out.measurements = _measurements(run, lim)
    return out


def _rebuilt(run: RunEvidence, rank: int, found: dict[int, dict[str, Any]], lim: dict[str, Any],
             out: Analysis) -> None:
    """One line that builds a new DataLoader with workers again and again while training goes on."""
    sites: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for loader in found.values():
        if loader.get("path") and loader.get("line") and int(loader.get("num_workers") or 0) > 0:
            sites.setdefault((loader["path"], int(loader["line"])), []).append(loader)
    totals = {int(e["index"]): e for e in run.of_kind("dataloader-total", PROBE, rank) if "index" in e}
    callers = {int(e["index"]): e for e in run.of_kind("dataloader-caller", PROBE, rank) if e.get("line")}
    for built in sites.values():
        points = sorted({int(b.get("step") or 0) for b in built})
        if len(built) < int(lim.get("min_rebuilds", 3)) or len(points) < int(lim.get("min_rebuild_points", 2)):
            continue
        starts = [float(t["first_wait_ms"]) for b in built
                  if (t := totals.get(int(b["index"]))) and t.get("first_wait_ms") is not None]
        workers = max(int(b.get("num_workers") or 0) for b in built)
        values: dict[str, Any] = {"constructions": len(built), "num_workers": workers,
                                  "built_at_steps": points[:10]}
        summary = (f"this line built {len(built)} DataLoaders with num_workers={workers} while training went on "
                   f"(after {', '.join(str(p) for p in points[:6])}{'…' if len(points) > 6 else ''} optimizer "
                   "steps): each one starts its worker processes from scratch")
        if starts:
            values["first_batch_ms_median"] = round(statistics.median(starts), 3)
            values["first_batch_ms_total"] = round(sum(starts), 3)
            summary += (f"; their first batch waited {statistics.median(starts):.1f} ms (median; "
                        f"{sum(starts):.0f} ms in all) for the workers to start")
        caller = next((callers[int(b["index"])] for b in built if int(b.get("index") or 0) in callers), None)
        evidence = None
        if caller is not None:
            # built inside a factory or a data module's method: the training loop's call of it, the line to move
            values["loop_call_line"] = int(caller["line"])
            summary += (f"; the training loop builds it through the call on line {caller['line']} (in "
                        f"{caller.get('function')}): make that call once, before the epoch loop")
            evidence = [Evidence(kind="probe", source=PROBE, location=loader_location(run, caller),
                                 summary="the call in the training loop that builds a new DataLoader every epoch")]
        else:
            summary += "; build the loader once before the epoch loop"
        summary += " (with persistent_workers=True)"
        out.symptoms.append(run.symptom("dataloader-rebuilt", probe=PROBE, summary=summary, values=values,
                                        location=loader_location(run, built[0]), rank=rank, evidence=evidence))


def _measurements(run: RunEvidence, lim: dict[str, Any]) -> dict[str, Any]:
    rank = run.ranks[0]
    found = loaders(run, rank)
    m: dict[str, Any] = {"dataloaders": len(found)}
    wait = data_wait(run, rank, lim)
    if wait is not None:
        m.update(data_wait_fraction=round(wait.fraction, 4), data_wait_ms_median=round(wait.wait_ms, 3),
                 step_ms_median=round(wait.step_ms, 3))
    totals = {int(e["index"]): e for e in run.of_kind("dataloader-total", PROBE, rank) if "index" in e}
    rows = []
    for index, loader in sorted(found.items()):
        where = loader_location(run, loader)
        row = {"index": index, "num_workers": loader.get("num_workers"), "batch_size": loader.get("batch_size"),
               "at": str(where) if where else None}
        total = totals.get(index)
        if total:
            row.update(batches=total.get("batches"), wait_ms=total.get("wait_ms"),
                       first_wait_ms=total.get("first_wait_ms"))
        rows.append({k: v for k, v in row.items() if v is not None})
    if rows:
        m["loaders"] = rows
    if not found:
        m["summary"] = "no DataLoader was constructed"
    elif wait is not None:
        m["summary"] = (f"{len(found)} DataLoader(s); the step waits on data {wait.fraction:.0%} of the time "
                        f"({wait.wait_ms:.2f} ms of {wait.step_ms:.2f} ms)")
    else:
        m["summary"] = f"{len(found)} DataLoader(s); too few steps to measure the data wait"
    return m

"""Classify the memory probe's evidence: growth, peak vs budget, OOM, fragmentation, host OOM.

Reads the events of probes/memory.py (see its docstring for what is measured
and the thresholds of each symptom; the numbers are in
rules/data/thresholds.toml, [memory]). CUDA-only inputs (`cuda_*` step
fields, the `cuda` dicts of `oom` and `memory-end`) use the layout of
`torch.cuda.memory_stats()`, flattened keys such as
"reserved_bytes.all.current".
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.source import accumulation_line, attribute_line, in_place_line
from torchdoctor.analysis.stats import Growth, sustained_growth, theil_sen
from torchdoctor.model import Evidence, Location

PROBE = "memory"
GIB_PER_MIB = 1 / 1024


@dataclass
class HolderGrowth:
    name: str
    kind: str  # tensor | list | dict | tuple | deque
    what: str  # graph | tensors | bytes
    growth: Growth
    location: Location | None
    graph_tensors: bool = False
    mib_slope: float | None = None


def _gib(mib: float | None) -> float | None:
    return None if mib is None else round(mib * GIB_PER_MIB, 6)


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        _growth(run, rank, lim, out)
        _peak(run, rank, lim, out)
        _oom(run, rank, out)
        _fragmentation(run, rank, lim, out)
        _host_oom(run, rank, lim, out)
    if run.of_kind("step") and any("cuda_allocated_mib" in (e.get(PROBE) or {}) for e in run.steps(0)):
        out.contexts.append("gpu")
    out.measurements = _measurements(run, lim)
    return out


# -- growth ------------------------------------------------------------------------


def _growth_args(lim: dict[str, Any]) -> dict[str, Any]:
    return {
        "after": float(lim.get("warmup_steps", 5)),
        "min_points": int(lim.get("min_points", 8)),
        "sustained_fraction": float(lim.get("sustained_fraction", 0.5)),
    }


def byte_series(run: RunEvidence, rank: int) -> tuple[str, str, list[int], list[float]]:
    """The series that measures live memory: CUDA allocated when CUDA was used, else RSS."""
    xs, ys = run.series(PROBE, "cuda_allocated_mib", rank)
    if xs:
        return "cuda_allocated", "CUDA allocated memory", xs, ys
    xs, ys = run.series(PROBE, "rss_mib", rank)
    return "rss", "The process RSS", xs, ys


def _growth(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    args = _growth_args(lim)
    series, label, xs, ys = byte_series(run, rank)
    byte = sustained_growth(
        xs, ys, min_slope=float(lim.get("min_slope_mib_per_step", 0.05)),
        min_total=float(lim.get("min_growth_mib", 16.0)), **args,
    )
    holders = _holder_growth(run, rank, lim)
    groups = _census_growth(run, rank, lim)
    if byte is None and not holders:
        return
    evidence: list[Evidence] = []
    if byte is not None:
        evidence.append(
            Evidence(
                kind="probe",
                source=PROBE,
                summary=f"{label} grew by {byte.slope:.2f} MiB per step from step {byte.from_step} to "
                f"{byte.to_step} ({byte.first:.0f} → {byte.last:.0f} MiB) and kept growing to the end",
                values={
                    "slope_mib_per_step": round(byte.slope, 3),
                    "growth_mib": round(byte.total, 1),
                    "steps_observed": byte.to_step - byte.from_step + 1,
                    "series": series,
                    "from_step": byte.from_step,
                    "to_step": byte.to_step,
                    "points": byte.points,
                },
            )
        )
    for h in holders:
        evidence.append(_holder_evidence(h))
    for g in groups[:2]:
        evidence.append(g)
    location = next((h.location for h in holders if h.location is not None), None)
    ends = ([byte.to_step] if byte else []) + [h.growth.to_step for h in holders]
    last_step = max(ends) if ends else None
    strong = bool(holders) or series == "cuda_allocated"
    first, *rest = evidence
    symptom = run.symptom(
        "memory-growth",
        probe=PROBE,
        summary=first.summary,
        values=first.values,
        location=location,
        step=last_step,
        rank=rank,
        confidence=1.0 if strong else 0.9,
        evidence=rest,
    )
    symptom.evidence[0].location = first.location  # the RSS series has no line of its own
    out.symptoms.append(symptom)


def _holder_series(run: RunEvidence, rank: int) -> dict[tuple[str, str, str], list[tuple[int, dict[str, Any]]]]:
    series: dict[tuple[str, str, str], list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for event in run.of_kind("holders", PROBE, rank):
        for h in event.get("holders", []):
            series[(h["name"], h.get("path", ""), h.get("function", ""))].append((int(event["step"]), h))
    return series


def _holder_growth(run: RunEvidence, rank: int, lim: dict[str, Any]) -> list[HolderGrowth]:
    args = _growth_args(lim)
    found: list[HolderGrowth] = []
    for (name, path, function), points in _holder_series(run, rank).items():
        if not _held_across_steps(points):
            continue
        last = points[-1][1]
        kind = last.get("kind", "tensor")
        growth: Growth | None = None
        what = ""
        if any("graph_nodes" in h for _, h in points):  # a tensor, or a dict of running sums
            pts = [(s, h["graph_nodes"], bool(h.get("truncated"))) for s, h in points if "graph_nodes" in h]
            cut = next((i for i, p in enumerate(pts) if p[2]), None)
            if cut is not None:
                pts = pts[: cut + 1]
            for segment in _regrowths(pts):
                growth = sustained_growth(
                    [p[0] for p in segment], [float(p[1]) for p in segment],
                    min_slope=float(lim.get("min_graph_nodes_per_step", 1.0)),
                    min_total=float(lim.get("min_graph_growth_nodes", 20)),
                    **{**args, "sustained_fraction": 0.0 if cut is not None else args["sustained_fraction"]},
                )
                if growth is not None:
                    break
            what = "graph"
        if growth is None and kind != "tensor" and any(h.get("graph_tensors") for _, h in points):
            # Tensors that carry a graph, kept across optimizer steps in a container that only grows: each keeps a
            # forward's activations alive, so one every few steps (an evaluation output appended every 5th step)
            # is a leak, and no allocator warm-up blurs a count (a short run is judged from its second step).
            growth = sustained_growth(
                [s for s, _ in points], [float(h.get("graph_tensors") or 0) for _, h in points],
                after=float(lim.get("graph_warmup_steps", 1)), min_points=int(lim.get("graph_min_points", 5)),
                min_slope=float(lim.get("min_container_graph_tensors_per_step", 0.05)),
                min_total=float(lim.get("min_container_graph_tensors", 3)),
                sustained_fraction=args["sustained_fraction"],
            )
            what = "tensors"
        if growth is None and kind != "tensor":
            growth = sustained_growth(
                [s for s, _ in points], [float(h.get("tensors", 0)) for _, h in points],
                min_slope=float(lim.get("min_container_tensors_per_step", 0.5)), min_total=3.0, **args,
            )
            what = "tensors"
            # By count alone only when they hold graphs (each keeps a step's activations alive); detached values
            # (`losses.append(loss.detach())`, a few bytes a step) must also grow in bytes like a big tensor.
            if growth is not None and not any(h.get("graph_tensors") for _, h in points) and sustained_growth(
                [s for s, _ in points], [float(h.get("mib", 0.0)) for _, h in points],
                min_slope=float(lim.get("min_slope_mib_per_step", 0.05)),
                min_total=float(lim.get("min_growth_mib", 16.0)), **args,
            ) is None:
                growth = None
        if growth is None:  # a big tensor (or container) whose bytes grow
            growth = sustained_growth(
                [s for s, _ in points], [float(h.get("mib", 0.0)) for _, h in points],
                min_slope=float(lim.get("min_slope_mib_per_step", 0.05)),
                min_total=float(lim.get("min_growth_mib", 16.0)), **args,
            )
            what = "bytes"
        if growth is None:
            continue
        mib_slope = theil_sen([float(s) for s, _ in points], [float(h.get("mib", 0.0)) for _, h in points])
        line = accumulation_line(path, name, last.get("lineno"), last.get("firstlineno"), function)
        location = run.location(path, line or last.get("lineno"), function) if path else None
        grown_as = None
        if line is None:
            # the frame that holds it under this name does not grow it: the name it goes by where it grows (a
            # helper's parameter that is the trainer's attribute)
            for alias in last.get("aliases") or []:
                grows = accumulation_line(alias.get("path", ""), alias["name"], alias.get("lineno"),
                                          alias.get("firstlineno"), alias.get("function"))
                if grows is not None:
                    grown_as = location = run.location(alias["path"], grows, alias.get("function"))
                    break
        if last.get("class_path") and last.get("attribute") and grown_as is None:
            # an attribute of an object of the script's own class: the line of that class that grows it, unless
            # a graph grows in place from the loop's own code (`stats.device_stat("loss").add_(loss)`: the class
            # only made the tensor)
            chained = in_place_line(path, name.partition(".")[0], last.get("lineno"), last.get("firstlineno"),
                                    function) if what == "graph" and path else None
            grows = None if chained else attribute_line(last["class_path"], last.get("class_name", ""),
                                                        last["attribute"])
            if chained is not None:
                location = run.location(path, chained, function)
            elif grows is not None:
                location = run.location(last["class_path"], grows, last.get("class_name"))
        found.append(
            HolderGrowth(
                name=name, kind=kind, what=what, growth=growth, location=location,
                graph_tensors=bool(last.get("graph_tensors")), mib_slope=mib_slope,
            )
        )
    order = {"graph": 0, "tensors": 1, "bytes": 2}
    return sorted(found, key=lambda h: (order[h.what], -h.growth.slope))


def _held_across_steps(points: list[tuple[int, dict[str, Any]]]) -> bool:
    """Whether a holder's graph outlived the steps (probes/holders.py `carried`: the graph root seen at one
    scan was still alive at the next). A graph that is bigger every step but dies with its step (a REINFORCE
    episode that gets longer, a batch that grows) holds nothing across steps: it is no leak. Holders without
    graphs, and evidence from before the probe told, count as held."""
    told = [bool(h["carried"]) for _, h in points if "carried" in h]
    return not told or 2 * sum(told) >= len(told)


def _regrowths(pts: list[tuple[int, int, bool]]) -> list[list[tuple[int, int, bool]]]:
    """A holder's graph-size series cut where it was reset, longest stretch first.

    `total_loss = 0.0` at each epoch's start drops the chain, and it grows again
    through the epoch: every stretch is a leak that lasts an epoch. The whole
    series would read as a saw-tooth that does not keep growing.
    """
    stretches: list[list[tuple[int, int, bool]]] = []
    for p in pts:
        if stretches and p[1] >= stretches[-1][-1][1] / 2:
            stretches[-1].append(p)
        else:
            stretches.append([p])
    return sorted(stretches, key=len, reverse=True)


def _holder_evidence(h: HolderGrowth) -> Evidence:
    g = h.growth
    values: dict[str, Any] = {"variable": h.name, "holder_kind": h.kind, "from_step": g.from_step, "to_step": g.to_step,
                              "steps_observed": g.to_step - g.from_step + 1}
    if h.what == "graph":
        held = "holds an autograd graph" if h.kind == "tensor" else f"(a {h.kind}) holds an autograd graph in a value"
        summary = (
            f"`{h.name}` {held} that grows by {g.slope:.1f} nodes per step "
            f"({g.first:.0f} → {g.last:.0f} nodes, steps {g.from_step}–{g.to_step}) while its bytes stay flat: "
            "every step's graph stays alive through it"
        )
        values.update(graph_nodes_growth_per_step=round(g.slope, 2), graph_nodes_first=int(g.first),
                      graph_nodes_last=int(g.last), tensor=f"the autograd graph held by {h.name}")
    elif h.what == "tensors":
        summary = f"`{h.name}` (a {h.kind}) gains {g.slope:.2f} tensors per step ({g.first:.0f} → {g.last:.0f})"
        if h.mib_slope:
            summary += f", {h.mib_slope:.2f} MiB per step"
        if h.graph_tensors:
            summary += ", and they hold autograd graphs"
        values.update(tensors_growth_per_step=round(g.slope, 3), holds_graph=h.graph_tensors,
                      tensor=f"the tensors kept in {h.name} (a {h.kind})")
        if h.mib_slope is not None:
            values["container_mib_per_step"] = round(h.mib_slope, 3)
    else:
        summary = f"`{h.name}` grows by {g.slope:.2f} MiB per step ({g.first:.1f} → {g.last:.1f} MiB)"
        values.update(holder_mib_per_step=round(g.slope, 3))
    return Evidence(kind="probe", source=PROBE, summary=summary, values=values, location=h.location)


def _census_growth(run: RunEvidence, rank: int, lim: dict[str, Any]) -> list[Evidence]:
    after = float(lim.get("warmup_steps", 5))
    censuses = [c for c in run.of_kind("census", PROBE, rank) if c.get("step", 0) >= after]
    if len(censuses) < 2 or censuses[-1]["step"] == censuses[0]["step"]:
        return []
    keys: dict[tuple, dict[int, dict[str, Any]]] = defaultdict(dict)
    for c in censuses:
        for g in c.get("groups", []):
            key = (tuple(g["shape"]), g["dtype"], g["device"], g["graph"], g.get("parameter", False))
            keys[key][int(c["step"])] = g
    steps = [int(c["step"]) for c in censuses]
    span = steps[-1] - steps[0]
    out: list[tuple[float, Evidence]] = []
    minimum = float(lim.get("min_census_tensors_per_step", 0.5))
    for key, seen in keys.items():
        counts = [float(seen.get(s, {}).get("count", 0)) for s in steps]
        slope = theil_sen([float(s) for s in steps], counts)
        if slope is None or slope < minimum or counts[-1] - counts[0] < minimum * span:
            continue
        last = seen.get(steps[-1]) or {}
        each = (last.get("mib", 0.0) / last["count"]) if last.get("count") else 0.0
        shape, dtype, device, graph, _ = key
        summary = (
            f"live tensors of shape {list(shape)} {dtype} on {device}"
            + (" holding autograd graphs" if graph else "")
            + f": {counts[0]:.0f} → {counts[-1]:.0f} between steps {steps[0]} and {steps[-1]} ({slope:+.2f} per step"
            + (f", {each:.2f} MiB each)" if each else ")")
        )
        out.append(
            (
                slope * max(each, 1e-6),
                Evidence(
                    kind="probe",
                    source=PROBE,
                    summary=summary,
                    values={
                        "tensor_shape": list(shape),
                        "tensor_dtype": dtype,
                        "tensor_device": device,
                        "tensor_holds_graph": graph,
                        "tensors_growth_per_step": round(slope, 3),
                        "tensor_mib_each": round(each, 4),
                        "tensor": f"{list(shape)} {dtype} tensors on {device}",
                    },
                ),
            )
        )
    return [e for _, e in sorted(out, key=lambda p: -p[0])]


# -- peak and budget ------------------------------------------------------------------


def _breakdown(run: RunEvidence, rank: int) -> dict[str, Any] | None:
    found = run.of_kind("breakdown", PROBE, rank)
    return found[-1] if found else None


def _cuda_end(run: RunEvidence, rank: int) -> dict[str, Any]:
    ends = run.of_kind("memory-end", PROBE, rank)
    return (ends[-1].get("cuda") or {}) if ends else {}


def peak_estimate(run: RunEvidence, rank: int) -> dict[str, Any] | None:
    """Peak memory and what it is made of: measured on CUDA, estimated from the tensors on CPU."""
    bd = _breakdown(run, rank)
    if bd is None:
        return None
    parts = {
        "parameters_gib": _gib(bd.get("parameters_mib")),
        "gradients_gib": _gib(bd.get("gradients_mib")),
        "optimizer_state_gib": _gib(bd.get("optimizer_state_mib")),
        "activations_gib": _gib(bd.get("activations_mib")),
    }
    known = sum(v for v in parts.values() if v is not None)
    cuda_peak = bd.get("cuda_peak_mib")
    end = _cuda_end(run, rank)
    if end.get("allocated_bytes.all.peak"):
        cuda_peak = max(cuda_peak or 0.0, end["allocated_bytes.all.peak"] / 2**20)
    result: dict[str, Any] = {**parts, "batch_size": bd.get("batch_size"), "device": bd.get("device")}
    if cuda_peak:
        result["peak_gib"] = _gib(cuda_peak)
        result["other_gib"] = round(max(result["peak_gib"] - known, 0.0), 6)
        result["estimated"] = False
    else:
        result["peak_gib"] = round(known, 6)
        result["estimated"] = True
    if bd.get("device_total_mib"):
        result["device_gib"] = _gib(bd["device_total_mib"])
    if bd.get("activations_skipped"):
        result["activations_skipped"] = bd["activations_skipped"]
    return result


def _peak(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    budget = run.options.get("gpu_memory_gib")
    peak = peak_estimate(run, rank)
    if peak is None:
        if budget is not None and rank == 0:
            out.notes.append(
                f"No fit verdict for --gpu-memory: the peak breakdown is measured on step "
                f"{int(lim.get('breakdown_step', 2)) + 1} and the run ended after {run.steps_completed(rank)} steps."
            )
        return
    capacity = budget if budget is not None else peak.get("device_gib")
    if not capacity:
        return
    near = float(lim.get("near_budget_fraction", 0.9))
    peak_gib = peak["peak_gib"]
    verdict = fit_verdict(peak, capacity, near)
    if peak_gib <= near * capacity:
        return
    what = "--gpu-memory budget" if budget is not None else "device's memory"
    severity = "error" if peak_gib > capacity else "warning"
    values = {k: v for k, v in peak.items() if v is not None}
    values["budget_gib" if budget is not None else "device_gib"] = round(capacity, 6)
    fits = batch_that_fits(peak, capacity, near)
    if fits is not None:
        values["batch_that_fits"] = fits
    out.symptoms.append(
        run.symptom(
            "high-memory",
            probe=PROBE,
            summary=f"{verdict} (the {what})",
            values=values,
            step=run.steps_completed(rank),
            rank=rank,
            severity=severity,
        )
    )


def batch_that_fits(peak: dict[str, Any], capacity: float, near: float) -> int | None:
    """The largest batch whose peak stays under near × capacity, if activations scale with the batch."""
    batch = peak.get("batch_size")
    act = peak.get("activations_gib")
    if not batch or not act:
        return None
    fixed = peak["peak_gib"] - act
    per_sample = act / batch
    return max(int(math.floor((near * capacity - fixed) / per_sample)), 0)


def fit_verdict(peak: dict[str, Any], capacity: float, near: float) -> str:
    p = peak["peak_gib"]
    at = f" at batch {peak['batch_size']}" if peak.get("batch_size") else ""
    est = "≈ " if peak.get("estimated") else ""
    head = f"peak {est}{size(p * 1024)}{at}"
    if p > capacity:
        return f"{head}: does not fit in {size(capacity * 1024)}"
    if p > near * capacity:
        return f"{head}: fits in {size(capacity * 1024)} with less than {1 - near:.0%} to spare"
    return f"{head}: fits in {size(capacity * 1024)}"


# -- OOM, fragmentation, host OOM -------------------------------------------------------


def _exception_location(run: RunEvidence, rank: int) -> tuple[Location | None, int | None]:
    events = run.of_kind("exception", rank=rank)
    if not events:
        return None, None
    frame = events[-1].get("user_frame") or {}
    where = run.location(frame["path"], frame.get("line"), frame.get("function")) if frame.get("path") else None
    return where, events[-1].get("step")


def _oom(run: RunEvidence, rank: int, out: Analysis) -> None:
    for event in run.of_kind("oom", PROBE, rank):
        where, step = _exception_location(run, rank)
        cuda = event.get("cuda") or {}
        values: dict[str, Any] = {
            "device": "cuda" if cuda else "cpu",
            "rss_gib": _gib(event.get("rss_mib")),
            "peak_rss_gib": _gib(event.get("peak_rss_mib")),
            "error_type": event.get("error_type"),
        }
        summary = f"{event.get('error_type')} after {event.get('step')} optimizer steps"
        if cuda:
            allocated = cuda.get("allocated_bytes.all.current", 0) / 2**30
            reserved = cuda.get("reserved_bytes.all.current", 0) / 2**30
            values.update(
                allocated_gib=round(allocated, 4),
                reserved_gib=round(reserved, 4),
                reserved_unallocated_gib=round(reserved - allocated, 4),
                peak_allocated_gib=round(cuda.get("allocated_bytes.all.peak", 0) / 2**30, 4),
                num_alloc_retries=cuda.get("num_alloc_retries"),
            )
            if cuda.get("device_total_bytes"):
                values["total_gib"] = round(cuda["device_total_bytes"] / 2**30, 4)
            summary += f": {allocated:.2f} GiB allocated by tensors, {reserved:.2f} GiB reserved by the allocator"
        else:
            summary += f": process RSS {event.get('rss_mib', 0):.0f} MiB (peak {event.get('peak_rss_mib', 0):.0f} MiB)"
        values.update(_before_the_oom(run, rank, values.get("total_gib")))
        out.symptoms.append(
            run.symptom("oom", probe=PROBE, summary=summary, values={k: v for k, v in values.items() if v is not None},
                        location=where, step=step, rank=rank)
        )


def _before_the_oom(run: RunEvidence, rank: int, card_gib: float | None) -> dict[str, Any]:
    """What the specialist needs to offer `torchdoctor fit` for this very run: the script's own
    arguments, and the breakdown measured on an earlier step (when the run got that far), with the
    batch it scales to on the card that ran out."""
    extra: dict[str, Any] = {}
    argv = (run.start(rank) or {}).get("argv") or []
    if len(argv) > 1:
        extra["script_args"] = [str(a) for a in argv[1:]]
    peak = peak_estimate(run, rank)
    if peak is None:
        return extra
    for key in ("parameters_gib", "gradients_gib", "optimizer_state_gib", "activations_gib", "batch_size"):
        if peak.get(key) is not None:
            extra[f"measured_{key}"] = peak[key]
    if card_gib:
        near = float(run.limits("memory").get("near_budget_fraction", 0.9))
        fits = batch_that_fits(peak, card_gib, near)
        if fits is not None:
            extra.update(batch_that_fits=fits, spare_fraction=round(1 - near, 4))
    return extra


def fragmentation_of(stats: dict[str, Any], lim: dict[str, Any], which: str = "current") -> dict[str, float] | None:
    """Reserved-but-unallocated memory from `torch.cuda.memory_stats()` keys, if it is large.

    `which` is "current" (at an OOM: the room the failed request could not use) or "peak" (over the
    run: what the allocator reserved at its high-water mark beyond what tensors ever held at theirs).
    Current figures at the end of a run are not used: once the step's activations are freed the
    allocator keeps their blocks cached, so a healthy run ends with most of its peak reserved and idle.
    """
    reserved = stats.get(f"reserved_bytes.all.{which}")
    allocated = stats.get(f"allocated_bytes.all.{which}")
    if not reserved or allocated is None:
        return None
    gap = reserved - allocated
    if gap < float(lim.get("fragmentation_fraction", 0.3)) * reserved:
        return None
    if gap / 2**30 < float(lim.get("fragmentation_min_gib", 1.0)):
        return None
    return {
        "reserved_gib": round(reserved / 2**30, 4),
        "allocated_gib": round(allocated / 2**30, 4),
        "reserved_unallocated_gib": round(gap / 2**30, 4),
        "inactive_split_gib": round(stats.get(f"inactive_split_bytes.all.{which}", 0) / 2**30, 4),
    }


def _fragmentation(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    candidates = [("at the OOM", "current", e.get("cuda") or {}) for e in run.of_kind("oom", PROBE, rank)]
    candidates.append(("at the peak", "peak", _cuda_end(run, rank)))
    for when, which, stats in candidates:
        found = fragmentation_of(stats, lim, which)
        if found is None:
            continue
        out.symptoms.append(
            run.symptom(
                "fragmentation",
                probe=PROBE,
                summary=f"{found['reserved_unallocated_gib']:.2f} GiB reserved by the caching allocator but not "
                f"allocated {when} ({found['reserved_gib']:.2f} GiB reserved, {found['allocated_gib']:.2f} GiB "
                "allocated)",
                values={**found, "when": when},
                step=run.steps_completed(rank),
                rank=rank,
            )
        )
        return


def _host_oom(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    if run.outcome.stopped != "killed" or run.outcome.signal != "SIGKILL":
        return
    starts = run.of_kind("memory-start", PROBE, rank)
    ram = starts[0].get("ram_limit_mib") if starts else None
    _, rss = run.series(PROBE, "rss_mib", rank)
    if not ram or not rss:
        return
    last = rss[-1]
    if last < float(lim.get("host_oom_rss_fraction", 0.8)) * ram:
        return
    out.symptoms.append(
        run.symptom(
            "host-oom",
            probe=PROBE,
            summary=f"Killed by SIGKILL with the process RSS at {last:.0f} MiB of {ram:.0f} MiB available: "
            "most likely the kernel's OOM killer",
            values={"rss_gib": _gib(last), "ram_gib": _gib(ram)},
            step=run.steps_completed(rank),
            rank=rank,
            confidence=0.7,
        )
    )


# -- the numbers for the report ------------------------------------------------------------


def _measurements(run: RunEvidence, lim: dict[str, Any]) -> dict[str, Any]:
    m: dict[str, Any] = {}
    series, label, xs, ys = byte_series(run, 0)
    _, rss = run.series(PROBE, "rss_mib", 0)
    if rss:
        m["rss_first_step_mib"] = rss[0]
        m["rss_last_step_mib"] = rss[-1]
    ends = run.of_kind("memory-end", PROBE, 0)
    if ends:
        m["peak_rss_mib"] = ends[-1].get("peak_rss_mib")
    warm = float(lim.get("warmup_steps", 5))
    window = [(x, y) for x, y in zip(xs, ys, strict=True) if x > warm]
    if len(window) >= 2:
        slope = theil_sen([float(x) for x, _ in window], [y for _, y in window])
        if slope is not None:
            m[f"{series}_slope_mib_per_step"] = round(slope, 4)
    _, cuda_peak = run.series(PROBE, "cuda_peak_mib", 0)
    if cuda_peak:
        m["cuda_peak_mib"] = max(cuda_peak)
    censuses = run.of_kind("census", PROBE, 0)
    if censuses:
        last = censuses[-1]
        m["live_tensors"] = last.get("tensors")
        m["live_tensor_mib"] = last.get("mib")
        m["graph_tensors"] = last.get("graph_tensors")
    peak = peak_estimate(run, 0)
    budget = run.options.get("gpu_memory_gib")
    if peak:
        m.update({k: v for k, v in peak.items() if v is not None and k != "activations_skipped"})
        capacity = budget if budget is not None else peak.get("device_gib")
        if capacity:
            m["budget_gib"] = round(capacity, 6)
            m["fits"] = peak["peak_gib"] <= capacity
            m["verdict"] = fit_verdict(peak, capacity, float(lim.get("near_budget_fraction", 0.9)))
    costs = run.of_kind("memory-cost", PROBE, 0)
    if costs:
        c = costs[-1]
        m.update(probe_us_per_step=c.get("per_step_us"), probe_us_per_step_median=c.get("per_step_median_us"),
                 scans=c.get("scans"), scan_ms_total=c.get("scan_ms_total"),
                 censuses=c.get("censuses"), census_ms_total=c.get("census_ms_total"))
    m["summary"] = _summary(m, series, peak)
    return {k: v for k, v in m.items() if v is not None}


def size(mib: float) -> str:
    """A size for people: KiB, MiB or GiB, whichever reads best."""
    if mib >= 1024:
        return f"{mib / 1024:.2f} GiB"
    if mib >= 1:
        return f"{mib:.1f} MiB"
    return f"{mib * 1024:.0f} KiB"


def _summary(m: dict[str, Any], series: str, peak: dict[str, Any] | None) -> str:
    parts: list[str] = []
    if "rss_last_step_mib" in m:
        text = f"RSS {m['rss_last_step_mib']:.0f} MiB at the last step"
        if "peak_rss_mib" in m:
            text += f" (peak {m['peak_rss_mib']:.0f} MiB)"
        parts.append(text)
    slope = m.get(f"{series}_slope_mib_per_step")
    if slope is not None:
        parts.append(f"{'CUDA allocated' if series == 'cuda_allocated' else 'RSS'} slope {slope:+.3f} MiB/step after warm-up")
    if "cuda_peak_mib" in m:
        parts.append(f"CUDA peak {m['cuda_peak_mib']:.0f} MiB")
    if "live_tensors" in m:
        parts.append(f"{m['live_tensors']} live tensors ({size(m.get('live_tensor_mib', 0))})")
    if peak:
        pieces = ", ".join(
            f"{label} {size(peak[key] * 1024)}"
            for key, label in (("parameters_gib", "parameters"), ("gradients_gib", "gradients"),
                               ("optimizer_state_gib", "optimizer state"), ("activations_gib", "activations"))
            if peak.get(key) is not None
        )
        at = f" at batch {peak['batch_size']}" if peak.get("batch_size") else ""
        head = m.get("verdict") or f"peak {'≈ ' if peak.get('estimated') else ''}{size(peak['peak_gib'] * 1024)}{at}"
        parts.append(f"{head} ({pieces})")
    if "probe_us_per_step" in m:
        per_step = m.get("probe_us_per_step_median", m["probe_us_per_step"])
        parts.append(
            f"probe cost {per_step:.1f} µs/step, {_count(m.get('censuses', 0), 'census', 'censuses')} "
            f"({m.get('census_ms_total', 0):.0f} ms), {_count(m.get('scans', 0), 'holder scan', 'holder scans')} "
            f"({m.get('scan_ms_total', 0):.0f} ms)"
        )
    return "; ".join(parts)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"

"""Classify the profile probe's window: where the step goes, host syncs, GPU idleness, launch overhead.

Reads the `profile` event of probes/profile.py (its docstring says how each
number is measured); thresholds in rules/data/thresholds.toml, [profile]
(and [data] for the data wait, shared with the data probe, which owns
`dataloader-bound` when it ran).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.data import DataWait, bound, dataloader_symptom
from torchdoctor.analysis.evidence import RunEvidence

PROBE = "profile"
PARTS = ("data", "forward", "backward", "optimizer", "other")


def split(event: dict[str, Any]) -> dict[str, float]:
    """Milliseconds per step of each part and `<part>_fraction`; `other` is the remainder."""
    step = float(event.get("step_ms") or 0.0)
    ms = {p: float(event.get(f"{p}_ms") or 0.0) for p in PARTS if p != "other"}
    ms["other"] = max(step - sum(ms.values()), 0.0)
    out: dict[str, float] = {"step_ms": round(step, 3)}
    for part in PARTS:
        out[f"{part}_ms"] = round(ms[part], 3)
        out[f"{part}_fraction"] = round(ms[part] / step, 4) if step > 0 else 0.0
    return out


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        events = run.of_kind("profile", PROBE, rank)
        if not events:
            for skipped in run.of_kind("profile-skipped", PROBE, rank)[:1]:
                out.notes.append(f"profile probe: no window was profiled ({skipped.get('text')}).")
            continue
        event = events[-1]
        parts = split(event)
        _data(run, rank, event, parts, out)
        _syncs(run, rank, event, lim, out)
        _gpu(run, rank, event, parts, lim, out)
        _launch(run, rank, event, lim, out)
        _slow(run, rank, event, parts, lim, out)
        for note in event.get("notes") or []:
            out.notes.append(f"profile probe: {note}.")
        if event.get("device") == "cuda":
            out.contexts.append("gpu")
    out.measurements = _measurements(run)
    if run.of_kind("profile", PROBE) and all(e.get("device") != "cuda" for e in run.of_kind("profile", PROBE)):
        out.notes.append("profile probe: GPU utilisation not measured (no GPU was used); on CPU the launch "
                         "figures count operators instead of kernels.")
    return out


def _window(event: dict[str, Any]) -> tuple[int, int, int]:
    return int(event.get("from_step", 0)), int(event.get("to_step", 0)), int(event.get("steps", 1))


def _data(run: RunEvidence, rank: int, event: dict[str, Any], parts: dict[str, float], out: Analysis) -> None:
    if "data" in run.probes:
        return  # the data probe measures every step and names the loader
    first, last, steps = _window(event)
    wait = DataWait(fraction=parts["data_fraction"], step_ms=parts["step_ms"], wait_ms=parts["data_ms"],
                    steps=steps, from_step=first, to_step=last, loader=None)
    dlim = run.limits("data")
    if bound(wait, dlim):
        out.symptoms.append(dataloader_symptom(run, rank, wait, dlim, PROBE, None,
                                               extra=_fractions(parts)))


def _fractions(parts: dict[str, float]) -> dict[str, float]:
    return {f"{p}_fraction": parts[f"{p}_fraction"] for p in PARTS}


def _syncs(run: RunEvidence, rank: int, event: dict[str, Any], lim: dict[str, Any], out: Analysis) -> None:
    first, last, steps = _window(event)
    rows = event.get("sync_calls")
    cuda = event.get("device") == "cuda"
    if rows is not None:
        per_step = float(event.get("sync_calls_total", 0)) / max(steps, 1)
    else:
        per_step = float(event.get("local_scalar_dense_per_step") or 0.0)
    if per_step < float(lim.get("min_syncs_per_step", 1.0)):
        return
    values: dict[str, Any] = {"syncs_per_step": round(per_step, 3), "device": event.get("device"),
                              "from_step": first, "to_step": last}
    location = None
    if rows:
        top = rows[0]
        values.update(call=top["call"], call_per_step=top["per_step"])
        location = run.location(top["path"], top["line"], top.get("function"))
        values["calls"] = [f"{r['call']} at {run.location(r['path'], r['line'])} ×{r['per_step']:g}/step"
                           for r in rows]
    else:
        values["call"] = "aten::_local_scalar_dense (.item() and friends)"
    if cuda and event.get("runtime_syncs_per_step") is not None:
        values["runtime_syncs_per_step"] = event["runtime_syncs_per_step"]
    where = f" ({values['call']} at {location})" if location else ""
    summary = f"{per_step:.3g} host-device syncs per step over steps {first}–{last}{where}"
    severity = None
    if not cuda:
        summary += ": free on this CPU run, each one will drain the GPU queue on a GPU"
        severity = "info"
    out.symptoms.append(run.symptom("host-sync", probe=PROBE, summary=summary, values=values, location=location,
                                    step=last, rank=rank, severity=severity))


def _gpu(run: RunEvidence, rank: int, event: dict[str, Any], parts: dict[str, float], lim: dict[str, Any],
         out: Analysis) -> None:
    if event.get("device") != "cuda":
        return
    util = event.get("gpu_busy_fraction")
    if util is None:
        util = event.get("nvml_gpu_util")
    if util is None or util >= float(lim.get("low_gpu_util", 0.5)):
        return
    first, last, _ = _window(event)
    values = {"gpu_util": util, "data_wait_fraction": parts["data_fraction"], "step_ms": parts["step_ms"],
              "kernels_per_step": event.get("kernels_per_step"), "mean_kernel_us": event.get("mean_kernel_us"),
              "nvml_gpu_util": event.get("nvml_gpu_util"), "from_step": first, "to_step": last}
    summary = f"the GPU ran kernels {util:.0%} of the time over steps {first}–{last}"
    if parts["data_fraction"] >= 0.2:
        summary += f"; {parts['data_fraction']:.0%} of the step waits on data"
    out.symptoms.append(run.symptom("low-gpu-util", probe=PROBE, summary=summary,
                                    values={k: v for k, v in values.items() if v is not None}, step=last, rank=rank))


def _launch(run: RunEvidence, rank: int, event: dict[str, Any], lim: dict[str, Any], out: Analysis) -> None:
    first, last, _ = _window(event)
    if event.get("device") == "cuda":
        count, mean = event.get("kernels_per_step"), event.get("mean_kernel_us")
        max_mean = float(lim.get("launch_mean_kernel_us", 10.0))
        min_count = float(lim.get("launch_min_kernels_per_step", 200))
        what = "kernels"
    else:
        count, mean = event.get("ops_per_step"), event.get("mean_op_us")
        max_mean = float(lim.get("launch_mean_op_us", 15.0))
        min_count = float(lim.get("launch_min_ops_per_step", 200))
        what = "operators"
    if count is None or mean is None or count < min_count or mean > max_mean:
        return
    values = {"kernels_per_step": count, "mean_kernel_us": mean, "device": event.get("device"),
              "top_op": event.get("top_op"), "from_step": first, "to_step": last}
    summary = (f"{count:.0f} {what} per step averaging {mean:.1f} µs each (steps {first}–{last}): dispatch "
               "overhead, not computation, sets the pace")
    out.symptoms.append(run.symptom("launch-bound", probe=PROBE, summary=summary,
                                    values={k: v for k, v in values.items() if v is not None}, step=last, rank=rank,
                                    severity=_load_severity(event)))


def _load_severity(event: dict[str, Any]) -> str | None:
    """On a CPU the step's Python time moves with the machine's load (other processes share its cores): a
    window of slow steps there is information, not a warning. On a GPU the catalogue's severity stands."""
    return "info" if event.get("device") == "cpu" else None


def _slow(run: RunEvidence, rank: int, event: dict[str, Any], parts: dict[str, float], lim: dict[str, Any],
          out: Analysis) -> None:
    if parts["other_fraction"] < float(lim.get("slow_other_fraction", 0.4)):
        return
    if parts["other_ms"] < float(lim.get("slow_other_ms", 5.0)):
        return
    if event.get("forward_ms") is None:
        return  # forward was not timed (compiled code): "other" would include it
    first, last, _ = _window(event)
    values: dict[str, Any] = {"step_ms": parts["step_ms"], **_fractions(parts), "other_ms": parts["other_ms"],
                              "from_step": first, "to_step": last}
    if event.get("top_op"):
        values["top_op"] = event["top_op"]
    summary = (f"{parts['other_fraction']:.0%} of the {parts['step_ms']:.1f} ms step (steps {first}–{last}) is "
               "spent outside data loading, forward, backward and the optimizer step: Python work in the "
               "training loop itself")
    out.symptoms.append(run.symptom("slow-step", probe=PROBE, summary=summary, values=values, step=last, rank=rank,
                                    severity=_load_severity(event)))


def _measurements(run: RunEvidence) -> dict[str, Any]:
    rank = run.ranks[0]
    events = run.of_kind("profile", PROBE, rank)
    if not events:
        return {"summary": "no window was profiled"}
    event = events[-1]
    parts = split(event)
    first, last, steps = _window(event)
    m: dict[str, Any] = {"from_step": first, "to_step": last, **parts}
    if event.get("forward_ms") is None:
        m["forward_timed"] = False
    for key in ("top_op", "ops_per_step", "mean_op_us", "kernels_per_step", "mean_kernel_us", "gpu_busy_fraction",
                "nvml_gpu_util", "process_cpu_percent", "system_cpu_percent", "cpu_count", "sync_calls_total", "summary_ms"):
        if event.get(key) is not None:
            m[key] = event[key]
    m["top_ops"] = [f"{o['name']} {o['self_ms_per_step']:.3f} ms/step" for o in (event.get("top_ops") or [])[:5]]
    if event.get("device") != "cuda":
        m["gpu_util"] = "not measured (no GPU)"
    shown = ", ".join(f"{p} {parts[f'{p}_fraction']:.0%}" for p in PARTS)
    m["summary"] = f"steps {first}–{last}: {parts['step_ms']:.1f} ms per step = {shown}"
    return m

"""How many optimizer steps, how fast: the runner's own numbers for every run.

Step times are the intervals between consecutive step events (the child's
clock), so they include data loading, forward, backward and the optimizer.
"""

from __future__ import annotations

import statistics

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    steps = run.steps(0)
    m: dict[str, float | int | str] = {"steps": run.steps_completed(0)}
    if steps:
        m["first_step_s"] = round(float(steps[0]["t"]), 3)
        times = [float(b["t"]) - float(a["t"]) for a, b in zip(steps, steps[1:], strict=False)]
        if times:
            median = statistics.median(times)
            m["step_time_median_ms"] = round(median * 1e3, 3)
            m["steps_per_s"] = round(1.0 / median, 2) if median > 0 else 0.0
        m["summary"] = f"{m['steps']} optimizer steps; the first after {m['first_step_s']:.1f} s" + (
            f", then {m['step_time_median_ms']:.1f} ms per step (median)" if "step_time_median_ms" in m else ""
        )
    else:
        started = any(run.start(r) for r in run.ranks)
        torch_seen = bool(run.of_kind("torch"))
        m["summary"] = "no optimizer step completed"
        if started and not run.of_kind("step"):
            out.notes.append(
                "No optimizer step was counted: a step is a call of optimizer.step() on a torch.optim "
                "optimizer" + ("" if torch_seen else " (the script may not have imported torch)") + "."
            )
    if len(run.ranks) > 1:
        m["ranks"] = len(run.ranks)
    out.measurements = m
    return out

"""How many optimizer steps, how fast: the runner's own numbers for every run.

Step times are the intervals between consecutive step events (the child's
clock), so they include data loading, forward, backward and the optimizer.
"""

from __future__ import annotations

import statistics

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.sites import latest, location, plural


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
        m["summary"] = "no optimizer step completed"
        skipped = _all_skipped_by_scaler(run)
        if skipped:
            # The script did call optimizer.step() through GradScaler.step(); the scaler refused each one because
            # the gradients were inf/NaN. The NaN probe measured those steps (its finding says where the values
            # come from), so "nothing was measured" would contradict the report; what the run lacks is a step.
            m["summary"] = (f"no optimizer step completed: the GradScaler skipped all "
                            f"{plural(skipped, 'step')} the script attempted (inf or NaN gradients)")
            out.notes.append(
                f"The GradScaler skipped every one of the {plural(skipped, 'optimizer step')} the script attempted "
                "(their gradients held inf or NaN), so the weights never changed and the checks that run after a "
                "completed step (memory per step, the profile window) had nothing to measure."
            )
        else:
            blind = _nothing_measured(run)
            if blind is not None:
                out.symptoms.append(blind)
    if len(run.ranks) > 1:
        m["ranks"] = len(run.ranks)
    out.measurements = m
    return out


def _all_skipped_by_scaler(run: RunEvidence) -> int:
    """Optimizer steps attempted through a GradScaler when it skipped every one of them, else 0."""
    attempts = 0
    for rank in run.ranks:
        state = latest(run, "amp", "amp-summary", "scaler-progress", rank=rank)
        if state is None:
            continue
        tried, skipped = int(state.get("attempts") or 0), int(state.get("skipped") or 0)
        if not tried or skipped < tried:
            return 0
        attempts += tried
    return attempts


def _activity(run: RunEvidence) -> dict[str, int]:
    """Training activity other than optimizer steps, from the probes that count it (absent: not measured)."""
    seen: dict[str, int] = {}
    for kind, key, name in (("accumulation-summary", "backwards", "backward passes"),
                            ("validation-summary", "forwards", "model forwards")):
        counts = [e.get(key) for e in run.of_kind(kind) if isinstance(e.get(key), int)]
        if counts:
            seen[name] = sum(counts)
    return seen


def _nothing_measured(run: RunEvidence):
    """A run that ended normally with no optimizer step and no other training activity says so: a report of
    "no symptoms" from a run whose probes never saw training would vouch for code it never measured."""
    if run.outcome.stopped not in ("completed", "steps", "exited") or not any(run.start(r) for r in run.ranks):
        return None  # a crash, a hang or a script that never started is its own story
    if any(run.steps_completed(r) for r in run.ranks):
        return None  # the ranks on this node (of a multi-node job, rank 0 may be elsewhere) took steps
    activity = _activity(run)
    backwards = activity.get("backward passes", 0)
    if backwards:
        # Gradients were computed, but no torch.optim optimizer stepped (weights updated by hand, an optimizer
        # of another library, a framework whose step the probes did not see): every per-step probe measured
        # nothing, and a report of "no symptoms" would vouch for steps it never saw.
        return run.symptom(
            "nothing-measured",
            probe="steps",
            summary=(f"no optimizer step was counted: {plural(backwards, 'backward pass', 'backward passes')} ran, "
                     "but no optimizer.step() of a torch.optim optimizer was seen, so the per-step checks (NaN, "
                     "memory per step, the profile window) measured nothing"),
            values={"steps": 0, "torch_imported": bool(run.of_kind("torch")),
                    **{k.replace(" ", "_"): v for k, v in activity.items()}},
        )
    if any(activity.values()):
        return None
    torch_seen = bool(run.of_kind("torch"))
    children = run.of_kind("child-process")
    if children:
        # The script handed its work to processes it started (torch.multiprocessing.spawn, Lightning's ddp_spawn
        # or ddp_fork): the training most likely ran there. Nothing about the script is wrong; what the report
        # lacks is coverage, and it says where the training went.
        first = children[0]
        methods = sorted({str(e.get("method")) for e in children})
        return run.symptom(
            "nothing-measured",
            probe="steps",
            summary=(f"nothing was measured in the script's own process: it started "
                     f"{plural(len(children), 'process', 'processes')} with multiprocessing ({', '.join(methods)}; "
                     f"`{first.get('target')}`), where the training ran out of the probes' reach (they run in the "
                     "script's process and in torchrun's ranks)"),
            values={"steps": 0, "torch_imported": torch_seen, "child_processes": len(children),
                    "start_methods": methods, "child_target": first.get("target"),
                    **{k.replace(" ", "_"): v for k, v in activity.items()}},
            location=location(run, first.get("site")),
            severity="info",
        )
    if not torch_seen:
        why = "the script never imported torch in the process torchdoctor watched"
    else:
        counted = ", ".join(f"0 {name}" for name in activity) or "no probe that counts backward passes or forwards ran"
        why = f"torch was imported, but no optimizer.step() of a torch.optim optimizer was seen ({counted})"
    return run.symptom(
        "nothing-measured",
        probe="steps",
        summary=f"nothing was measured: {why}",
        values={"steps": 0, "torch_imported": torch_seen, **{k.replace(" ", "_"): v for k, v in activity.items()}},
    )

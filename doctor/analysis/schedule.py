"""Learning-rate schedulers as they ran: planned length against steps taken, order, the two LR curves.

Reads the schedule probe's events (probes/schedule.py): `scheduler` (as
constructed), `scheduler-steps` / `scheduler-end` (counts, intervals, the
replayed curve), `scheduler-early`, `scheduler-error`. Thresholds:
rules/data/thresholds.toml [schedule].

Only schedules with a planned length (OneCycleLR total_steps, CyclicLR's
cycle, CosineAnnealingLR T_max, LinearLR / ConstantLR / PolynomialLR
total_iters, a SequentialLR whose last part has one) are judged by
comparing that length with the steps taken: a period (StepLR step_size,
CosineAnnealingWarmRestarts T_0, ExponentialLR's gamma) or a lambda fits
per-batch and per-epoch stepping alike, so those never raise. A LambdaLR's
length is read from its replayed curve when the curve ends (the last change,
then a flat tail): a warm-up + cosine lambda sized in optimizer steps is then
judged like a planned schedule; a lambda that never ends (0.9 ** epoch) is not.

A planned schedule stepped once every k optimizer steps (k ≥
`min_interval`) is sized in optimizer steps when, on a finished run, the
optimizer took about its length (between `used_fraction` and
`sized_factor` times it) while the scheduler took less than
`used_fraction` of it; on a run stopped early (--steps) only the kinds
documented as per-batch (OneCycleLR, CyclicLR) are judged, on the
projection over the length they were sized for. A schedule stepped after
every optimizer step that passes `overrun_factor` × its planned length
(MultiStepLR: `milestone_overrun_factor` × its last milestone) runs
through it several times (or sits at its end value). Both come with the
intended and the projected learning-rate curves: a sparkline in the
evidence and `lr_curves.csv` in the run directory.
"""

from __future__ import annotations

import csv
from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.sites import location, plural
from torchdoctor.analysis.source import config_key_line, unrun_call_line
from torchdoctor.model import Evidence
from torchdoctor.probes.userframes import display_path

PROBE = "schedule"
BARS = "▁▂▃▄▅▆▇█"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    curves: list[dict[str, Any]] = []
    lines = []
    for rank in run.ranks:
        children = {c for e in run.of_kind("scheduler", PROBE, rank) for c in (e.get("children") or [])}
        for created in run.of_kind("scheduler", PROBE, rank):
            state = _state(run, rank, created["index"])
            if rank == 0:
                lines.append(_line(created, state))
            _order(run, rank, created, out)
            if state is not None and not state.get("steps"):
                _never_stepped(run, rank, created, state, children, lim, out)
                continue
            if state is None or state.get("child") or state.get("positioned"):
                continue  # a scheduler the script places with step(epoch) is not counted in calls
            found = _granularity(run, rank, created, state, lim)
            if found is not None:
                symptom, curve = found
                out.symptoms.append(symptom)
                if curve:
                    curves.append(curve)
    if curves:
        path = run.run_dir / "lr_curves.csv"
        _write_curves(path, curves)
        out.artifacts["lr_curves"] = display_path(str(path), run.cwd)
    if lines:
        out.measurements = {"schedulers": len(lines), "summary": "; ".join(lines[:4])}
    return out


def _never_stepped(run: RunEvidence, rank: int, created: dict[str, Any], state: dict[str, Any], children: set,
                   lim: dict[str, Any], out: Analysis) -> None:
    """A scheduler whose step() was never called on a completed run while its optimizer took
    `min_unstepped_optimizer_steps` steps or more after it was built: the learning rate never left its start. Not a
    part of a SequentialLR/ChainedScheduler (the composite steps it), nor one on an optimizer another scheduler
    drives (a spare)."""
    steps = int(state.get("optimizer_steps") or 0)
    finished = run.outcome.stopped == "completed" and run.outcome.exit_code in (0, None)
    if not finished or steps < int(lim.get("min_unstepped_optimizer_steps", 10)):
        return
    if created.get("index") in children or any(str(c) == str(created.get("index")) for c in children):
        return
    others = [e for e in run.of_kind("scheduler-end", PROBE, rank)
              if e.get("index") != created.get("index") and e.get("steps")]
    if any(_optimizer_of(run, rank, e.get("index")) == created.get("optimizer") for e in others):
        return
    site = created.get("site") or {}
    text = (f"{created['scheduler']} built at line {site.get('line')} for the "
            f"{created.get('optimizer')} was never stepped while the optimizer took {plural(steps, 'step')}: the "
            f"learning rate stayed at {created.get('lr')} for the whole run")
    values = {"scheduler": created["scheduler"], "optimizer_steps": steps, "lr": created.get("lr")}
    where, evidence = location(run, site), None
    # the script's own step() call of that scheduler, which never ran (a condition that never held, a function
    # never called): the line to change; the construction stays as the second place
    unrun = unrun_call_line(site["path"], site.get("line"), "step") if site.get("path") else None
    ran = {(e.get("step_site") or {}).get("line") for kind in ("scheduler-steps", "scheduler-end")
           for e in run.of_kind(kind, PROBE, rank) if (e.get("step_site") or {}).get("path") == site.get("path")}
    if unrun is not None and unrun not in ran:  # a line that stepped another scheduler bound to that name did run
        values["unrun_step_line"] = unrun
        text += (f"; its step() on line {unrun} never ran: the condition or the code path around it never held in "
                 "this run")
        evidence = [Evidence(kind="probe", source=PROBE, location=where,
                             summary=f"the {created['scheduler']} that was never stepped, built here")]
        where = run.location(site["path"], unrun, None)
    out.symptoms.append(run.symptom("scheduler-never-stepped", probe=PROBE, summary=text, values=values,
                                    location=where, step=run.steps_completed(rank), rank=rank, evidence=evidence))


def _optimizer_of(run: RunEvidence, rank: int, index: Any) -> str | None:
    return next((e.get("optimizer") for e in run.of_kind("scheduler", PROBE, rank) if e.get("index") == index), None)


def _state(run: RunEvidence, rank: int, index: int) -> dict[str, Any] | None:
    for kind in ("scheduler-end", "scheduler-steps"):
        found = [e for e in run.of_kind(kind, PROBE, rank) if e.get("index") == index]
        if found:
            return found[-1]
    return None


def _interval(state: dict[str, Any]) -> int | None:
    """The usual number of optimizer steps between two scheduler steps (the most frequent gap)."""
    gaps = {int(k): v for k, v in (state.get("intervals") or {}).items()}
    if not gaps:
        return None
    return max(gaps.items(), key=lambda kv: (kv[1], kv[0]))[0]


def _line(created: dict[str, Any], state: dict[str, Any] | None) -> str:
    kind = created["scheduler"]
    length, period = created.get("length"), created.get("period")
    text = kind + (f" (planned {length} steps)" if length else f" (period {period} steps)" if period else "")
    if state is None:
        return text + ": never stepped"
    k = _interval(state)
    text += f": {plural(state['steps'], 'step')} over {plural(state['optimizer_steps'], 'optimizer step')}"
    if k:
        text += f", every {plural(k, 'optimizer step')}"
    return text


# -- scheduler-order ----------------------------------------------------------------------------


def _order(run: RunEvidence, rank: int, created: dict[str, Any], out: Analysis) -> None:
    early = next((e for e in run.of_kind("scheduler-early", PROBE, rank) if e.get("index") == created["index"]), None)
    if early is None:
        return
    where = location(run, early.get("site"))
    out.symptoms.append(
        run.symptom(
            "scheduler-order",
            probe=PROBE,
            summary=f"{created['scheduler']}.step() ran before its optimizer had taken a single step: the schedule's "
            "first learning-rate value is skipped and every later step uses the next one",
            values={"scheduler": created["scheduler"], "optimizer_steps_before": 0, "optimizer": created.get("optimizer")},
            location=where,
            step=0,
            rank=rank,
        )
    )


# -- scheduler-granularity ----------------------------------------------------------------------


def _granularity(run: RunEvidence, rank: int, created: dict[str, Any], state: dict[str, Any],
                 lim: dict[str, Any]) -> tuple[Any, dict[str, Any] | None] | None:
    kind = created["scheduler"]
    steps = int(state.get("steps") or 0)
    opt_steps = int(state.get("optimizer_steps") or 0)
    k = _interval(state)
    finished = run.outcome.stopped == "completed" and run.outcome.exit_code in (0, None)
    error = next((e for e in run.of_kind("scheduler-error", PROBE, rank) if e.get("index") == created["index"]), None)
    site = state.get("step_site") or (error or {}).get("site")
    if state.get("step_by_library") and created.get("site"):
        # A framework steps the scheduler (Lightning's "interval", the Trainer): the user's line is where it is
        # made and configured (configure_optimizers, create_scheduler), not the trainer.fit() that stepped it.
        site = created["site"]
    where = location(run, site)
    per_step_kinds = set(lim.get("per_step_kinds", ["OneCycleLR", "CyclicLR"]))
    # Only a planned length (total_steps, T_max, total_iters) compared with the steps taken tells per-batch from
    # per-epoch; a period (StepLR's step_size, ExponentialLR's gamma) fits either. Older evidence recorded
    # StepLR's step_size as a length: the kind list, not the event, decides what is judged.
    planned = per_step_kinds | set(lim.get("planned_kinds", ["CosineAnnealingLR", "LinearLR", "PolynomialLR",
                                                              "ConstantLR", "SequentialLR"]))
    length = created.get("length") if kind in planned else None
    from_curve = False
    # A lambda, or the script's own scheduler class: no length to read, only the curve it replays.
    by_curve = kind in set(lim.get("lambda_kinds", ["LambdaLR"])) or _custom(created)
    if length is None and by_curve:
        length = horizon(state.get("curve") or [], float(lim.get("horizon_min_tail", 0.2)))
        from_curve = length is not None
    # Stepped once per epoch by a framework: the fix is where the framework is told how often to step it (the
    # "interval" of Lightning's scheduler config), when the function that built it says so on one line.
    epoch_where = _interval_where(run, created, state, lim) or where
    min_interval = int(lim.get("min_interval", 2))
    used = float(lim.get("used_fraction", 0.5))
    sized = float(lim.get("sized_factor", 2.0))
    base = {"scheduler": kind, "lr_steps_planned": length, "total_steps": length, "optimizer_steps": opt_steps}

    if error is not None and "Tried to step" in str(error.get("error")):
        values = {**base, "lr_steps_taken": steps + 1, "steps_taken": steps + 1, "stepped_per": "batch",
                  "error": error["error"]}
        summary = (f"{kind} raised after {plural(steps, 'step')}: {error['error']} — it is stepped more often than "
                   "the length it was built for")
        return run.symptom("scheduler-granularity", probe=PROBE, summary=summary, values=values, location=where,
                           step=steps, rank=rank), None

    if length and steps >= 1 and k is not None and k >= min_interval:
        if finished:
            # Sized in optimizer steps, stepped per epoch: the run's optimizer steps match the plan (at least
            # `used` of it, at most `sized` times it: an epoch-sized schedule cut short by early stopping has
            # taken far more optimizer steps than its length) while the scheduler took under `used` of it.
            judged = steps < used * length and used * length <= opt_steps <= sized * length
            # Or sized in batches of one epoch (T_max=len(loader)) and stepped once per epoch: the plan is exactly
            # the optimizer steps between two scheduler steps, and the run used under `used` of it.
            judged = judged or (k == length and steps < used * length)
        else:
            # Stopped early (--steps, a crash): only kinds documented as per-batch, and only while the optimizer
            # has not yet gone far past the plan (then the plan was evidently counted in epochs).
            judged = kind in per_step_kinds and opt_steps <= sized * length
        if judged:
            if from_curve:
                base = {**base, "length_from": "the replayed lambda curve"}
            return _per_epoch(run, rank, created, state, length, k, finished, epoch_where, base)

    if by_curve:
        found = _warmup_per_epoch(run, rank, created, state, lim, k, finished, epoch_where, base) \
            or _spent(run, rank, created, state, lim, where, base)
        if found is not None:
            return found

    return _overrun(run, rank, created, state, lim, k, where, base) or _idle(run, rank, created, state, lim, where,
                                                                          base)


def _custom(created: dict[str, Any]) -> bool:
    """A scheduler class of the script's own (a NoamLR subclassing LRScheduler), not one of torch's."""
    module = str(created.get("module") or "")
    return bool(module) and not module.startswith("torch.")


def _interval_where(run: RunEvidence, created: dict[str, Any], state: dict[str, Any], lim: dict[str, Any]) -> Any:
    """For a scheduler a framework steps, the line of the function that built it which sets the stepping interval
    (`"interval": "step"`, even misplaced); None when that function sets none, or the user steps it."""
    site = created.get("site") or {}
    if not state.get("step_by_library") or not site.get("path"):
        return None
    line = config_key_line(site["path"], site.get("line"), list(lim.get("interval_keys", ["interval"])))
    return location(run, {**site, "line": line}) if line is not None else None


def warmup_peak(curve: list[Any], min_rise: float) -> int | None:
    """Where a replayed schedule's warm-up peaks: the step of its highest learning rate, reached by a climb that
    never falls from the first value, which is at most `min_rise` × that peak. None when the schedule does not
    start by warming up."""
    values = [v for v in curve if isinstance(v, (int, float))]
    if len(values) != len(curve) or len(values) < 4:
        return None
    peak = max(range(len(values)), key=lambda i: (values[i], -i))
    if peak < 3 or values[peak] <= 0 or values[0] > min_rise * values[peak]:
        return None
    if any(values[i + 1] < values[i] for i in range(peak)):
        return None
    return peak


def _warmup_per_epoch(run: RunEvidence, rank: int, created: dict[str, Any], state: dict[str, Any],
                      lim: dict[str, Any], k: int | None, finished: bool, where: Any,
                      base: dict[str, Any]) -> tuple[Any, dict[str, Any] | None] | None:
    """A warm-up counted in optimizer steps (its peak within the steps the run took) that the scheduler, stepped
    once every `k` ≥ 2 of them, never finished: the whole run trained at a fraction of the intended rate."""
    steps = int(state.get("steps") or 0)
    opt_steps = int(state.get("optimizer_steps") or 0)
    if not finished or k is None or k < int(lim.get("min_interval", 2)) or steps < 1:
        return None
    peak = warmup_peak(state.get("curve") or [], float(lim.get("warmup_min_rise", 0.5)))
    if peak is None or peak > opt_steps or steps >= float(lim.get("used_fraction", 0.5)) * peak:
        return None
    base = {**base, "lr_steps_planned": peak, "total_steps": peak, "length_from": "the replayed warm-up"}
    return _per_epoch(run, rank, created, state, peak, k, finished, where, base)


def _spent(run: RunEvidence, rank: int, created: dict[str, Any], state: dict[str, Any], lim: dict[str, Any],
           where: Any, base: dict[str, Any]) -> tuple[Any, None] | None:
    """A schedule whose learning rate fell to practically zero (under `spent_ratio` × its peak) and stayed there
    for `min_spent_share` of the steps it took or more: sized for fewer steps than it is stepped (a horizon in
    epochs stepped per batch, a scheduler stepped several times per optimizer step). A schedule that decays to
    zero at the end of the run it was sized for reaches zero only at its last steps."""
    kind = created["scheduler"]
    steps = int(state.get("steps") or 0)
    opt_steps = int(state.get("optimizer_steps") or 0)
    values = (state.get("curve") or [])[: steps + 1]
    if steps < 4 or len(values) != steps + 1 or not all(isinstance(v, (int, float)) for v in values):
        return None
    peak = max(values)
    if peak <= 0:
        return None
    ratio = float(lim.get("spent_ratio", 0.01))
    spent = steps + 1
    while spent > 0 and values[spent - 1] <= ratio * peak:
        spent -= 1
    tail = steps - spent
    if spent == 0 or tail < 3 or tail < float(lim.get("min_spent_share", 0.25)) * steps:
        return None
    share = tail / steps
    per_opt = steps / max(1, opt_steps)
    values_out = {**base, "lr_steps_planned": spent, "total_steps": spent, "lr_steps_taken": steps,
                  "steps_taken": steps, "stepped_per": "batch", "lr_peak": peak, "lr_final": values[-1],
                  "spent_share": round(share, 3), "scheduler_steps_per_optimizer_step": round(per_opt, 2)}
    how = f" ({per_opt:.1f} scheduler steps per optimizer step)" if per_opt >= 1.5 else ""
    summary = (f"{kind}'s learning rate fell to {values[spent]:.3g} (under {ratio:.0%} of its peak {peak:.3g}) at its "
               f"step {spent} of {steps}{how} and stayed there: the last {share:.0%} of the run trained with a "
               "learning rate of practically zero — the schedule is sized for fewer steps than it is stepped "
               "(a horizon counted in epochs stepped per batch, or stepped more than once per optimizer step)")
    built = _built_at(run, created, where)
    return run.symptom("scheduler-granularity", probe=PROBE, summary=summary, values=values_out, location=where,
                       step=run.steps_completed(rank), rank=rank, evidence=[built] if built else None), None


def horizon(curve: list[Any], min_tail: float) -> int | None:
    """Where a replayed schedule ends: the last step at which its learning rate still changes, when a flat tail of
    at least `min_tail` × that many steps follows (a warm-up + cosine lambda sized in steps sits at its final
    value after total_steps). None for a curve that never settles in what was replayed, or never changes."""
    values = [v for v in curve if isinstance(v, (int, float))]
    if len(values) != len(curve) or len(values) < 3:
        return None
    if max(abs(v) for v in values) <= 0:
        return None
    # a change relative to the values themselves: a decay with no end (0.9 ** epoch) keeps changing by its own
    # ratio however small it gets, while a schedule that has ended repeats its final value exactly
    changes = [i for i in range(1, len(values))
               if abs(values[i] - values[i - 1]) > 1e-6 * max(abs(values[i]), abs(values[i - 1]))]
    if not changes:
        return None
    end = changes[-1]
    if end < 2 or len(values) - 1 - end < min_tail * end:
        return None
    return end


def _idle(run: RunEvidence, rank: int, created: dict[str, Any], state: dict[str, Any], lim: dict[str, Any],
          where: Any, base: dict[str, Any]) -> tuple[Any, None] | None:
    """A scheduler stepped again with no optimizer step since its previous step, over and over while training goes
    on: a phase that trains nothing (the test epoch of a shared run_epoch()) advances it too."""
    idle = int(state.get("idle_steps") or 0)
    steps = int(state.get("steps") or 0)
    if state.get("step_by_library") or idle < int(lim.get("min_idle_steps", 3)) \
            or idle < float(lim.get("min_idle_share", 0.25)) * steps:
        return None
    kind = created["scheduler"]
    opt_steps = int(state.get("optimizer_steps") or 0)
    values = {**base, "lr_steps_taken": steps, "steps_taken": steps, "stepped_per": "phase", "idle_steps": idle}
    summary = (f"{kind}.step() ran {plural(idle, 'time')} with no optimizer step since its previous step "
               f"({steps} scheduler steps over {opt_steps} optimizer steps): a phase that trains nothing, such as an "
               f"evaluation pass, steps it too, so the schedule advances {steps / max(1, steps - idle):.1f}× faster "
               "than the training it was planned for")
    return run.symptom("scheduler-granularity", probe=PROBE, summary=summary, values=values, location=where,
                       step=steps, rank=rank), None


def _per_epoch(run: RunEvidence, rank: int, created: dict[str, Any], state: dict[str, Any], length: int, k: int,
               finished: bool, where: Any, base: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
    """A schedule sized in optimizer steps that advances once every `k` of them: 1/k of its plan is used."""
    kind = created["scheduler"]
    steps = int(state.get("steps") or 0)
    opt_steps = int(state.get("optimizer_steps") or 0)
    curve = state.get("curve") or []
    taken = steps if finished else max(1, round(length / k))
    fraction = taken / length
    values = {**base, "lr_steps_taken": taken, "steps_taken": taken, "stepped_per": "epoch",
              "optimizer_steps_per_scheduler_step": k, "used_fraction": round(fraction, 4),
              "projected": not finished}
    sized = (f"{kind}'s warm-up peaks after {length} steps" if base.get("length_from") == "the replayed warm-up"
             else f"{kind}'s lambda reaches its final value after {length} steps" if base.get("length_from") else
             f"{kind} is sized for {length} optimizer steps")
    if finished:
        summary = (f"{sized} but scheduler.step() ran once every "
                   f"{plural(k, 'optimizer step')}: it took {taken} of its {length} steps "
                   f"({fraction:.0%} of its schedule) over the whole run")
    else:
        summary = (f"{sized} but scheduler.step() runs once every "
                   f"{plural(k, 'optimizer step')}: over the {length} optimizer steps it was sized for it would "
                   f"take about {taken} ({fraction:.0%} of its schedule; projected from {plural(steps, 'step')} "
                   f"in {opt_steps} optimizer steps)")
    intended = [_at(curve, i) for i in range(length + 1)]
    projected = [_at(curve, i // k) for i in range(length + 1)]
    return _with_curves(run, rank, created, values, summary, where, intended, projected, "the planned "
                        f"{length} optimizer steps", curve)


def _overrun(run: RunEvidence, rank: int, created: dict[str, Any], state: dict[str, Any], lim: dict[str, Any],
             k: int | None, where: Any, base: dict[str, Any]) -> tuple[Any, dict[str, Any] | None] | None:
    """A schedule sized in epochs stepped after every optimizer step, far past its end."""
    kind = created["scheduler"]
    steps = int(state.get("steps") or 0)
    curve = state.get("curve") or []
    if k != 1:
        return None
    if kind in set(lim.get("decay_kinds", ["StepLR", "ExponentialLR", "MultiplicativeLR"])):
        return _collapsed(run, rank, created, state, lim, where, base)
    if kind in set(lim.get("overrun_kinds", ["CosineAnnealingLR", "PolynomialLR"])):
        length = created.get("length")
        factor = float(lim.get("overrun_factor", 2.0))
    elif kind in set(lim.get("milestone_kinds", ["MultiStepLR"])):
        # Milestones are points, not a length: iteration-based training sets them in steps and trains on
        # after the last. Only a run that goes on many times past it decayed everything at its very start.
        config = created.get("config") or {}
        length = config.get("last_milestone") or max(config.get("milestones") or [0]) or created.get("length")
        factor = float(lim.get("milestone_overrun_factor", 10.0))
    else:
        return None
    if not length or steps <= factor * length:
        return None
    values = {**base, "lr_steps_planned": length, "total_steps": length, "lr_steps_taken": steps,
              "steps_taken": steps, "stepped_per": "batch", "overrun": round(steps / length, 2)}
    what = {"CosineAnnealingLR": f"the learning rate has gone through {steps / (2 * length):.1f} cosine cycles "
            "instead of one decay",
            "PolynomialLR": f"the learning rate reached its final value after {length} of them",
            "MultiStepLR": f"every decay happened within the first {length} of them"}.get(
        kind, f"its schedule ended after {length} of them")
    summary = (f"{kind} is sized for {length} steps (likely epochs) but scheduler.step() runs after every "
               f"optimizer step: {steps} steps so far, {steps / length:.1f}× its length — {what}")
    intended = [_at(curve, min(length, int(i * length / steps))) for i in range(steps + 1)]
    projected = [_at(curve, i) for i in range(steps + 1)]
    return _with_curves(run, rank, created, values, summary, where, intended, projected,
                        f"the {steps} optimizer steps run", curve)


def _collapsed(run: RunEvidence, rank: int, created: dict[str, Any], state: dict[str, Any], lim: dict[str, Any],
               where: Any, base: dict[str, Any]) -> tuple[Any, dict[str, Any] | None] | None:
    """A decaying schedule (a period, no planned length) stepped after every optimizer step whose learning rate
    was spent early: it fell below `collapse_ratio` of its start within the first `collapse_within` of the run
    (six decades of decay: an iteration-sized StepLR takes two or three) and stayed there. A StepLR sized in epochs (step_size = epochs // 2) stepped per batch does that; an
    iteration-sized one decays across the whole run."""
    kind = created["scheduler"]
    steps = int(state.get("steps") or 0)
    curve = [v for v in (state.get("curve") or [])[: steps + 1] if isinstance(v, (int, float))]
    if len(curve) < 2 or not curve[0] or curve[0] <= 0:
        return None
    ratio = float(lim.get("collapse_ratio", 1e-6))
    spent = next((i for i, v in enumerate(curve) if v < ratio * curve[0]), None)
    if spent is None or spent > float(lim.get("collapse_within", 0.8)) * steps:
        return None
    config = created.get("config") or {}
    shape = ", ".join(f"{key}={config[key]}" for key in ("step_size", "gamma") if config.get(key) is not None)
    values = {**base, "lr_steps_taken": steps, "steps_taken": steps, "stepped_per": "batch",
              "lr_initial": curve[0], "lr_final": curve[-1], "lr_spent_at_step": spent}
    summary = (f"{kind}{f'({shape})' if shape else ''} is stepped after every optimizer step: its learning rate fell "
               f"from {curve[0]:.3g} to {curve[spent]:.3g} (under {ratio:g}× its start) by step {spent} of {steps} "
               f"and ended at {curve[-1]:.3g} — a period sized in epochs applied per batch; the rest of the run "
               "trained with a learning rate of practically zero")
    built = _built_at(run, created, where)
    return run.symptom("scheduler-granularity", probe=PROBE, summary=summary, values=values, location=where,
                       step=run.steps_completed(rank), rank=rank, evidence=[built] if built else None), None


def _at(curve: list[Any], i: int) -> float | None:
    if not curve:
        return None
    return curve[min(i, len(curve) - 1)]


def _with_curves(run: RunEvidence, rank: int, created: dict[str, Any], values: dict[str, Any], summary: str,
                 where: Any, intended: list[Any], projected: list[Any], span: str,
                 curve: list[Any]) -> tuple[Any, dict[str, Any] | None]:
    evidence: list[Evidence] = []
    table = None
    if curve and all(v is not None for v in intended + projected):
        lo, hi = min(intended + projected), max(intended + projected)
        a, b = sparkline(intended, lo, hi), sparkline(projected, lo, hi)
        evidence.append(
            Evidence(
                kind="probe",
                source=PROBE,
                summary=f"learning rate over {span} ({lo:.3g} to {hi:.3g}) — intended {a}; as stepped {b}",
                values={"lr_curve_intended": a, "lr_curve_projected": b, "lr_min": lo, "lr_max": hi,
                        "lr_final_intended": intended[-1], "lr_final_projected": projected[-1]},
            )
        )
        table = {"index": created["index"], "kind": created["scheduler"], "intended": intended, "projected": projected}
    built = _built_at(run, created, where)
    if built is not None:
        evidence.append(built)
    symptom = run.symptom("scheduler-granularity", probe=PROBE, summary=summary, values=values, location=where,
                          step=run.steps_completed(rank), rank=rank, evidence=evidence)
    return symptom, table


def _built_at(run: RunEvidence, created: dict[str, Any], where: Any) -> Evidence | None:
    """The line that built the scheduler, when it is not the line that steps it: a length or period in the wrong
    unit is fixed there (T_max=epochs, step_size=epochs // 2), a wrong stepping place at `where`."""
    built = location(run, created.get("site"))
    if built is None or (where is not None and (built.path, built.line) == (where.path, where.line)):
        return None
    config = created.get("config") or {}
    shape = ", ".join(f"{key}={value}" for key, value in config.items() if isinstance(value, (int, float))
                      and not isinstance(value, bool))
    return Evidence(kind="probe", source=PROBE, location=built,
                    summary=f"{created['scheduler']}({shape}) was built here" if shape else
                    f"{created['scheduler']} was built here",
                    values={"scheduler": created["scheduler"], **{k: v for k, v in config.items()
                                                                   if isinstance(v, (int, float)) and not isinstance(v, bool)}})


def sparkline(values: list[float], low: float | None = None, high: float | None = None, width: int = 32) -> str:
    """`width` characters, each the mean of its share of `values`, from ▁ (`low`) to █ (`high`)."""
    if not values:
        return ""
    n = len(values)
    cells = []
    for c in range(min(width, n)):
        lo, hi = c * n // min(width, n), max((c + 1) * n // min(width, n), c * n // min(width, n) + 1)
        chunk = values[lo:hi]
        cells.append(sum(chunk) / len(chunk))
    low = min(values) if low is None else low
    high = max(values) if high is None else high
    if high - low <= 1e-12 * max(abs(high), 1e-30):
        return BARS[0] * len(cells)
    return "".join(BARS[min(int((v - low) / (high - low) * len(BARS)), len(BARS) - 1)] for v in cells)


def _write_curves(path: Any, curves: list[dict[str, Any]], max_rows: int = 2000) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["scheduler", "kind", "optimizer_step", "intended_lr", "projected_lr"])
        for c in curves:
            n = len(c["intended"])
            stride = max(1, n // max_rows)
            for i in range(0, n, stride):
                writer.writerow([c["index"], c["kind"], i, c["intended"][i], c["projected"][i]])

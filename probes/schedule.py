"""The schedule probe: every learning-rate scheduler, its planned length, and how often it really steps.

Measures
--------
- each `torch.optim.lr_scheduler` scheduler as constructed (the outermost
  `__init__` of LRScheduler and of the subclasses with their own): its kind,
  the user's line, its planned length (OneCycleLR `total_steps`,
  CosineAnnealingLR `T_max`, LinearLR/ConstantLR/PolynomialLR
  `total_iters`, CyclicLR's cycle, a SequentialLR's milestones plus its last
  part's length), or its period (StepLR `step_size`,
  CosineAnnealingWarmRestarts `T_0`), MultiStepLR's milestones (in its
  configuration), the children of a
  SequentialLR / ChainedScheduler, and a copy of it bound to a stand-in
  optimizer (so the intended curve can be replayed later without touching
  the real one);
- each `scheduler.step()` the script calls (steps a scheduler makes inside
  another one, or during construction, are not the script's): how many, the
  optimizer steps of its optimizer between two of them, whether the
  optimizer had never stepped at the first one, the learning rate after it
  (decimated to at most `max_lr_samples` points), and the user's line;
- every optimizer's steps (a global step post-hook: one dict update per
  step);
- at the end, the scheduler's own curve: the copy stepped once per
  scheduler step for max(planned length, steps seen) steps (at most
  `curve_max_steps`; a LambdaLR or the script's own scheduler class
  `lambda_replay_factor` × past the optimizer steps, to show where it ends or
  where its warm-up peaks), from which the analysis draws the intended and
  the projected learning-rate curves.

Costs: nothing per training step beyond the optimizer-step counter (< 1 µs);
~2 µs per `scheduler.step()`; ~0.1 ms per scheduler constructed (the copy);
replaying the curve at the end costs ~10 µs per point (≤ 50 ms).

Symptoms (thresholds in rules/data/thresholds.toml, [schedule]; classified
in doctor/analysis/schedule.py)
----------------------------------------------------------------------------
- scheduler-granularity: a schedule with a planned length sized in
  optimizer steps (OneCycleLR, CyclicLR; any planned one on a completed run
  whose optimizer steps match its length, a LambdaLR's length being where its
  replayed curve ends) stepped once every several
  optimizer steps — it will use only a fraction of its plan; or a schedule
  stepped every optimizer step that passes `overrun_factor` × its planned
  length (it cycles or sits at its end value), or OneCycleLR raising
  because it was stepped past total_steps; a lambda or the script's own
  scheduler whose replayed warm-up (counted in optimizer steps) was never
  finished because it is stepped per epoch, or whose learning rate sat under
  1% of its peak for a quarter of its steps or more. Periodic schedules and lambdas
  that never end (StepLR, ExponentialLR, 0.95 ** epoch, …) have no plan to
  compare and are judged only by the LR they reach;
- scheduler-order: `scheduler.step()` before its optimizer ever stepped
  (not after a GradScaler skipped the first steps: that order is right).
"""

from __future__ import annotations

import copy
import math
import os
import sys
import warnings
import weakref
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.patches import subclasses_of, user_site
from torchdoctor.probes.scalers import scaler_watch
from torchdoctor.probes.sites import above_wrappers, as_dict, here, outside_own_init
from torchdoctor.probes.transparent import transparent

# Attributes that say how long a scheduler's plan is, by kind (MultiStepLR's milestones are in `config`).
LENGTH_ATTRS = {
    "OneCycleLR": "total_steps",
    "CosineAnnealingLR": "T_max",
    "PolynomialLR": "total_iters",
    "LinearLR": "total_iters",
    "ConstantLR": "total_iters",
}
# Periodic kinds: how often they repeat, which is no plan's length (the analysis never compares it with the
# steps taken; a StepLR(step_size=30) is right stepped per batch or per epoch).
PERIOD_ATTRS = {
    "StepLR": "step_size",
    "CosineAnnealingWarmRestarts": "T_0",
}
CONFIG_ATTRS = ("total_steps", "T_max", "total_iters", "step_size", "gamma", "T_0", "T_mult", "eta_min",
                "patience", "factor", "mode", "total_size", "max_lrs", "base_lrs")


class _FakeOptimizer:
    """Stands in for the real optimizer in the scheduler's copy: param groups, no parameters."""

    def __init__(self, groups: list[dict[str, Any]]) -> None:
        self.param_groups = groups
        self._opt_called = True  # the copy is stepped "after" the optimizer: no ordering warning

    def step(self) -> None:
        """Never called; present because LRScheduler checks for its wrapper."""

    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]


class _Scheduler:
    __slots__ = ("ref", "index", "kind", "opt", "steps", "first_opt", "last_opt", "intervals", "lrs", "stride",
                 "step_site", "clone", "length", "child", "created_opt", "next_report", "early",
                 "step_by_library", "idle", "positioned", "custom")

    def __init__(self) -> None:
        self.steps = 0
        self.idle = 0  # steps with no optimizer step since the previous one, once training has begun
        self.first_opt: int | None = None
        self.last_opt: int | None = None
        self.intervals: dict[int, int] = {}
        self.lrs: list[tuple[int, float]] = []
        self.stride = 1
        self.step_site: tuple[str, int, str] | None = None
        self.step_by_library = False  # a framework (Lightning, the Trainer) calls scheduler.step(), not the user
        self.child = False
        self.next_report = 1
        self.early = False
        self.positioned = False  # stepped with an explicit epoch: the script sets the position, a call is no advance
        self.custom = False


class ScheduleProbe(Probe):
    name = "schedule"

    def install(self) -> None:
        import torch
        from torch.optim import lr_scheduler
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.torch = torch
        opt = self.options
        self.max_lr_samples = int(opt.get("max_lr_samples", 512))
        self.curve_max_steps = int(opt.get("curve_max_steps", 4096))
        self.max_schedulers = int(opt.get("max_schedulers", 16))
        self.lambda_replay_factor = float(opt.get("lambda_replay_factor", 1.5))
        self.records: dict[int, _Scheduler] = {}
        self.opt_steps: dict[int, int] = {}
        self._quiet = 0  # inside a scheduler's __init__ or step: nested calls are not the script's
        base = lr_scheduler.LRScheduler
        classes = [base, *subclasses_of(base)]
        for cls in classes:
            if "__init__" in cls.__dict__:
                cls.__init__ = self._wrap_init(cls.__dict__["__init__"])
            if "step" in cls.__dict__:
                cls.step = self._wrap_step(cls.__dict__["step"])
        register_optimizer_step_post_hook(self._counted)
        self.scalers = scaler_watch(torch)

    # -- wrappers ----------------------------------------------------------------------------------

    def _counted(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        key = id(optimizer)
        self.opt_steps[key] = self.opt_steps.get(key, 0) + 1

    def _wrap_init(self, original: Any) -> Any:
        probe = self

        def __init__(sched: Any, *args: Any, **kwargs: Any) -> None:
            outer = probe._quiet == 0
            probe._quiet += 1
            try:
                original(sched, *args, **kwargs)
            finally:
                probe._quiet -= 1
            if outer and probe.enabled:
                try:
                    probe._created(sched)
                except Exception as exc:  # noqa: BLE001 - never reaches the script
                    probe._fail("scheduler-init", exc)

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        __init__.__doc__ = original.__doc__
        return transparent(__init__)

    def _wrap_step(self, original: Any) -> Any:
        probe = self

        def step(sched: Any, *args: Any, **kwargs: Any) -> Any:
            if probe._quiet or not probe.enabled:
                return original(sched, *args, **kwargs)
            probe._quiet += 1
            try:
                result = original(sched, *args, **kwargs)
            except Exception as exc:
                probe._quiet -= 1
                probe._guard(probe._raised, sched, exc)
                raise
            probe._quiet -= 1
            probe._guard(probe._stepped, sched, _explicit_epoch(sched, args, kwargs))
            return result

        step.__wrapped__ = original  # type: ignore[attr-defined]
        step.__doc__ = original.__doc__
        return transparent(step)

    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001
            self._fail("scheduler-step", exc)

    def _fail(self, where: str, exc: BaseException) -> None:
        self.enabled = False
        self.emit("probe-error", where=where, error=f"{type(exc).__name__}: {exc}"[:500])

    # -- construction ------------------------------------------------------------------------------

    def adopt(self, sched: Any, site: tuple[str, int, str] | None) -> bool:
        """Follow a scheduler made before the probes were installed (a framework callback hands over the one the
        user gave the Trainer); `site` stands for its creation line. False if it is followed already."""
        if not self.enabled or id(sched) in self.records or not isinstance(sched, self.torch.optim.lr_scheduler.LRScheduler):
            return False
        self._created(sched, site=site)
        return True

    def _created(self, sched: Any, site: tuple[str, int, str] | None = None) -> None:
        if len(self.records) >= self.max_schedulers:
            return
        rec = _Scheduler()
        rec.ref = weakref.ref(sched)
        rec.index = len(self.records) + 1
        rec.kind = type(sched).__name__
        rec.custom = not type(sched).__module__.startswith("torch.")  # the script's own class: no length to read
        optimizer = getattr(sched, "optimizer", None)
        rec.opt = id(_stepping(optimizer, self.torch.optim.Optimizer))
        rec.created_opt = self.opt_steps.get(rec.opt, 0)
        rec.length = _length(sched)
        children = [c for c in getattr(sched, "_schedulers", []) or []]
        for child in children:
            found = self.records.get(id(child))
            if found is not None and found.ref() is child:
                found.child = True
        rec.clone, why_not = self._clone(sched, optimizer)
        self.records[id(sched)] = rec
        site = site if site is not None else user_site(outside_own_init(sys._getframe(1), sched))
        self.emit(
            "scheduler",
            index=rec.index,
            scheduler=rec.kind,
            module=type(sched).__module__,
            site=as_dict(site),
            length=rec.length,
            period=_period(sched),
            config=_config(sched),
            children=[type(c).__name__ for c in children],
            lr=_lr(optimizer),
            optimizer=type(optimizer).__name__ if optimizer is not None else None,
            optimizer_steps=rec.created_opt,
            replay=why_not or "ok",
        )

    def _clone(self, sched: Any, optimizer: Any) -> tuple[Any, str | None]:
        if optimizer is None or type(sched).__name__ == "ReduceLROnPlateau":
            return None, "stepped by a metric, not by a count"
        try:
            groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} | {"params": []}
                      for g in optimizer.param_groups]
            fake = _FakeOptimizer(groups)
            return copy.deepcopy(sched, memo={id(optimizer): fake}), None
        except Exception as exc:  # noqa: BLE001 - a scheduler holding something uncopyable
            return None, f"cannot copy it ({type(exc).__name__})"

    # -- steps ---------------------------------------------------------------------------------------

    def _record_of(self, sched: Any) -> _Scheduler | None:
        rec = self.records.get(id(sched))
        return rec if rec is not None and rec.ref() is sched else None

    def _stepped(self, sched: Any, explicit: bool = False) -> None:
        rec = self._record_of(sched)
        if rec is None:
            return
        rec.steps += 1
        rec.positioned = rec.positioned or explicit
        now = self.opt_steps.get(rec.opt, 0)
        if rec.steps == 1:
            rec.first_opt = now
            rec.step_site = user_site(above_wrappers("step", sys._getframe(1)))
            rec.step_by_library = _called_by_library(sys._getframe(1))
            # step(epoch) sets the schedule's value at that epoch (its closed form): nothing is skipped before the
            # optimizer's first step. A GradScaler that skipped the first steps makes an early call harmless too.
            if now == 0 and not self.scalers.steps and not explicit:
                rec.early = True
                self.emit("scheduler-early", index=rec.index, scheduler=rec.kind, site=as_dict(rec.step_site))
        else:
            gap = now - (rec.last_opt or 0)
            rec.intervals[gap] = rec.intervals.get(gap, 0) + 1
            if gap == 0 and now > 0:
                rec.idle += 1  # a phase that trains nothing (an evaluation pass) stepped it too
        rec.last_opt = now
        if rec.steps % rec.stride == 0:
            rec.lrs.append((now, _lr(getattr(sched, "optimizer", None))))
            if len(rec.lrs) >= self.max_lr_samples:
                rec.lrs = rec.lrs[::2]
                rec.stride *= 2
        if rec.steps >= rec.next_report:  # 1, 2, 4, 8, …: a crash keeps a recent count
            rec.next_report *= 2
            self._report(rec, "scheduler-steps")

    def _raised(self, sched: Any, exc: BaseException) -> None:
        rec = self._record_of(sched)
        if rec is None:
            return
        self.emit("scheduler-error", index=rec.index, scheduler=rec.kind, error=f"{type(exc).__name__}: {exc}"[:500],
                  steps=rec.steps, optimizer_steps=self.opt_steps.get(rec.opt, 0) - rec.created_opt,
                  site=here())

    def _report(self, rec: _Scheduler, kind: str, **extra: Any) -> None:
        self.emit(
            kind,
            index=rec.index,
            scheduler=rec.kind,
            steps=rec.steps,
            optimizer_steps=self.opt_steps.get(rec.opt, 0) - rec.created_opt,
            first_at_optimizer_step=rec.first_opt,
            intervals={str(k): v for k, v in sorted(rec.intervals.items())[:32]},
            step_site=as_dict(rec.step_site),
            step_by_library=rec.step_by_library,
            idle_steps=rec.idle,
            child=rec.child,
            early=rec.early,
            positioned=rec.positioned,
            **extra,
        )

    # -- the end -------------------------------------------------------------------------------------

    def finish(self, reason: str) -> None:
        for rec in self.records.values():
            curve, note = self._replay(rec)
            self._report(rec, "scheduler-end", lrs=rec.lrs, curve=curve, curve_note=note)

    def _replay(self, rec: _Scheduler) -> tuple[list[float], str | None]:
        """The scheduler's own curve: the LR after 0, 1, 2, … of its steps, replayed on the copy."""
        clone = rec.clone
        if clone is None:
            return [], None
        seen = self.opt_steps.get(rec.opt, 0) - rec.created_opt
        wanted = max(rec.length or 0, rec.steps, seen) + 1
        if rec.kind == "LambdaLR" or rec.custom:
            # no length to read: replay past the run's optimizer steps, so that a lambda (or the script's own
            # scheduler class) sized in them shows its end as a flat tail, its warm-up as a climb to a peak (the
            # analysis reads its length from there)
            wanted = max(wanted, int(self.lambda_replay_factor * seen) + 1)
        count = min(wanted, self.curve_max_steps)
        curve = [_lr(clone.optimizer)]
        note = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(count - 1):
                try:
                    clone.step()
                except Exception as exc:  # noqa: BLE001 - OneCycleLR past total_steps, a lambda that fails
                    note = f"the replay stopped after {len(curve) - 1} steps: {type(exc).__name__}: {exc}"[:300]
                    break
                curve.append(_lr(clone.optimizer))
        if wanted > count and note is None:
            note = f"replayed the first {count - 1} of {wanted - 1} steps"
        return [_round(v) for v in curve], note


def _stepping(optimizer: Any, base: type) -> Any:
    """The optimizer whose steps fire torch's step hooks: a wrapper that holds the real one under
    `.optimizer` (accelerate's AcceleratedOptimizer, which Hugging Face's Trainer hands to its scheduler)
    steps it without firing them itself, so its own steps are never counted."""
    for _ in range(4):  # wrappers of wrappers, bounded
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, base) or inner is optimizer:
            break
        optimizer = inner
    return optimizer


def _length(sched: Any) -> int | None:
    kind = type(sched).__name__
    attr = LENGTH_ATTRS.get(kind)
    value = getattr(sched, attr, None) if attr else None
    if kind == "CyclicLR":
        value = getattr(sched, "total_size", None)
    elif kind == "SequentialLR":
        milestones = getattr(sched, "_milestones", None) or []
        last = _length(sched._schedulers[-1]) if getattr(sched, "_schedulers", None) else None
        value = (milestones[-1] + last) if milestones and last else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value)


def _period(sched: Any) -> int | None:
    attr = PERIOD_ATTRS.get(type(sched).__name__)
    value = getattr(sched, attr, None) if attr else None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _config(sched: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr in CONFIG_ATTRS:
        value = getattr(sched, attr, None)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out[attr] = value
        elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value[:4]):
            out[attr] = [float(v) for v in value[:4]]
    milestones = getattr(sched, "milestones", None) or getattr(sched, "_milestones", None)
    if milestones:
        ordered = sorted(int(m) for m in milestones)
        out["milestones"] = ordered[:16]
        out["last_milestone"] = ordered[-1]
    return out


def _lr(optimizer: Any) -> float | None:
    try:
        return _round(float(optimizer.param_groups[0]["lr"]))
    except Exception:  # noqa: BLE001 - no groups, a tensor LR on a device
        return None


def _round(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return value
    return float(f"{value:.6g}")


def _called_by_library(frame: Any) -> bool:
    """Whether the code that called scheduler.step() is a library's (a framework steps it), past our wrappers and
    torch's own (a SequentialLR stepping its children)."""
    from torchdoctor.probes.userframes import is_library_file

    torch_dir = os.path.dirname(os.path.abspath(sys.modules["torch"].__file__))
    ours = os.path.dirname(os.path.abspath(__file__))
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith((ours, torch_dir)):
            return is_library_file(path)
        frame = frame.f_back
    return False


def _explicit_epoch(sched: Any, args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether a scheduler.step() call passed the epoch to set (the deprecated `step(epoch)`), which places the
    schedule at that epoch instead of advancing it one step. ReduceLROnPlateau's first argument is its metric."""
    if kwargs.get("epoch") is not None:
        return True
    return len(args) == 1 and args[0] is not None and not hasattr(sched, "is_better")

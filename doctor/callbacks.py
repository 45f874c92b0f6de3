"""Framework callbacks: a `torchdoctor.watch()` session around Lightning's fit or the Hugging Face Trainer's train.

    trainer = L.Trainer(..., callbacks=[torchdoctor.LightningCallback()])     # pip install torchdoctor[lightning]
    trainer = Trainer(..., callbacks=[torchdoctor.TrainerCallback()])         # pip install torchdoctor[hf]

Each is a thin entry point to the same in-process session as `watch()`
(doctor/watching.py): it starts before the framework builds the optimizers
and schedulers (so the probes see them made), ends when training ends — or
with the framework's exception — and adds what the framework itself knows to
the report: its own count of optimizer steps (compared with the probes'), its
precision, accumulation, clipping and checkpoint settings. The report then
names the framework's knobs first in its fixes (specialists/frameworks.py).

`steps=N` asks the framework to stop after N optimizer steps (Lightning's
`trainer.should_stop`, the Trainer's `control.should_training_stop`), so
training ends the framework's own way, never with an exception through it.

Neither framework is a dependency: this module imports them when a callback
class is first asked for (PEP 562 `__getattr__`), and says which extra to
install when one is missing. Under `torchdoctor run` the callbacks stand aside
(the run's probes measure the whole script).
"""

from __future__ import annotations

import sys
from typing import Any

from torchdoctor.watching import Watch

_CLASSES: dict[str, type] = {}


def _user_frame(outside: Any = None) -> tuple[str, int] | None:
    """The innermost frame of the user's own code (what called trainer.fit() / Trainer(...)), past the methods
    of `outside` (a Trainer subclass's own __init__ is not the line that builds the Trainer)."""
    from torchdoctor.probes.userframes import is_library_file

    frame = sys._getframe(1)
    while frame is not None:
        if not is_library_file(frame.f_code.co_filename) and (
                outside is None or frame.f_locals.get("self") is not outside):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


class _Session:
    """The session one callback instance runs around one fit()/train() call."""

    def __init__(self, framework: str, steps: int | None, probes: Any, out: Any, show: bool) -> None:
        if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
            raise ValueError("torchdoctor: steps must be a whole number of at least 1")
        self.framework = framework
        self.steps = steps
        self.probes = probes
        self.out = out
        self.show = show
        self.watch: Watch | None = None
        self.last: Watch | None = None  # the finished session, for `.report()` after training

    def begin(self, what: str, outside: Any = None) -> None:
        if self.watch is not None:  # a session left open (the framework ended without its end hook)
            self.end("exception", 1)
        where = _user_frame(outside)
        label = f"{what} at {_display(where)}" if where else what
        watch = Watch(probes=self.probes, out=self.out, show=self.show, label=label, where=where,
                      framework=self.framework)
        try:
            watch.start()
        except (ValueError, RuntimeError, OSError) as exc:  # a callback must never stop the user's training
            sys.stderr.write(f"torchdoctor: not watching this run: {exc}\n")
            return
        self.watch = watch

    def end(self, reason: str, code: int, exc: BaseException | None = None, facts: dict[str, Any] | None = None) -> None:
        watch, self.watch = self.watch, None
        if watch is None or not watch.active:
            self.last = watch or self.last
            return
        if exc is not None:
            session = watch._session
            try:
                session.record_exception(exc)
                session.notify_exception(exc)
            except Exception:  # noqa: BLE001 - the framework's exception comes first
                pass
        watch.facts = facts or {}
        watch.stop(reason, code)
        self.last = watch

    def watch_owner(self, owner: Any, *methods: str) -> None:
        """The framework object whose user-written method (the first of `methods` that is the user's) may hold
        tensors across steps: the memory probe scans it and names that method (Session.watch_owner)."""
        session = self.watch._session if self.watch is not None else None
        if session is None or owner is None:
            return
        for name in methods:
            method = getattr(type(owner), name, None)
            if method is not None and session.watch_owner(owner, method):
                return

    def adopt_scheduler(self, scheduler: Any) -> None:
        """A scheduler the user made before the session started (handed to the framework): the schedule probe
        follows it from now on, located at the line that handed it over (where the session started)."""
        session = self.watch._session if self.watch is not None else None
        probe = next((p for p in getattr(session, "probes", []) if p.name == "schedule"), None)
        if probe is None or scheduler is None or self.watch is None or self.watch._where is None:
            return
        path, line = self.watch._where
        try:
            probe.adopt(scheduler, (path, line, "<module>"))
        except Exception as exc:  # noqa: BLE001 - never reaches the user's training
            probe.enabled = False
            probe.emit("probe-error", where="adopt", error=f"{type(exc).__name__}: {exc}"[:500])

    def counted(self) -> int:
        return self.watch.steps_counted if self.watch is not None else 0


def _display(where: tuple[str, int]) -> str:
    import os

    from torchdoctor.probes.userframes import display_path

    return f"{display_path(where[0], os.getcwd())}:{where[1]}"


def clip_facts(norms: list[float], limit: Any) -> dict[str, Any]:
    """Gradient norms before clipping (as the framework measured or let us measure them) against its clip value."""
    norms = [n for n in norms if isinstance(n, (int, float)) and n == n]
    if not norms:
        return {}
    ordered = sorted(norms)
    facts: dict[str, Any] = {"grad_norm_before_clip_median": round(ordered[len(ordered) // 2], 6),
                             "grad_norm_before_clip_max": round(ordered[-1], 6), "grad_norm_samples": len(norms)}
    if isinstance(limit, (int, float)) and limit > 0:
        facts["clipped_fraction"] = round(sum(n > limit for n in norms) / len(norms), 3)
    return facts


def clip_note(facts: dict[str, Any], knob: str) -> str | None:
    """A sentence when clipping cut most steps: the clip value then sets the update size, it guards nothing."""
    share = facts.get("clipped_fraction")
    if not isinstance(share, float) or share < 0.5 or facts.get("grad_norm_samples", 0) < 5:
        return None
    return (f"Gradient clipping ({knob}) cut the gradient on {share:.0%} of the {facts['grad_norm_samples']} measured "
            f"steps (norm before clipping: median {facts['grad_norm_before_clip_median']:.4g}, max "
            f"{facts['grad_norm_before_clip_max']:.4g}): a clip value below the usual norm rescales every update "
            "like a smaller learning rate instead of guarding against spikes; set it above the median norm.")


def _total_norm(parameters: Any) -> float | None:
    torch = sys.modules.get("torch")
    grads = [p.grad for p in parameters if getattr(p, "grad", None) is not None]
    if torch is None or not grads:
        return None
    with torch.no_grad():
        return float(torch.linalg.vector_norm(torch.stack([g.detach().float().norm() for g in grads])))


def _ended_how(exc: BaseException) -> tuple[str, int]:
    return ("interrupted", 130) if isinstance(exc, KeyboardInterrupt) else ("exception", 1)


# -- Lightning ---------------------------------------------------------------------------------------


def _lightning_base() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback  # the older package name
        except ImportError:
            raise ImportError("torchdoctor.LightningCallback needs Lightning: pip install 'torchdoctor[lightning]'") \
                from None
    return Callback


def lightning_facts(trainer: Any, counted: int, norms: list[float] | None = None) -> dict[str, Any]:
    """What Lightning knows about the fit that just ended (its own step count, precision, knobs), and the gradient
    norms before its clipping, measured in on_before_optimizer_step."""
    global_step = int(getattr(trainer, "global_step", 0) or 0)
    checkpoint = getattr(trainer, "checkpoint_callback", None)
    facts: dict[str, Any] = {
        "framework": "lightning",
        "framework_steps": global_step,
        "probe_steps": counted,
        "precision": str(getattr(trainer, "precision", "")),
        "accumulate_grad_batches": getattr(trainer, "accumulate_grad_batches", None),
        "gradient_clip_val": getattr(trainer, "gradient_clip_val", None),
        "strategy": type(getattr(trainer, "strategy", None)).__name__,
        "checkpoint_dir": getattr(checkpoint, "dirpath", None),
    }
    facts.update(clip_facts(norms or [], facts["gradient_clip_val"]))
    facts["summary"] = (f"Lightning: {global_step} optimizer steps by trainer.global_step ({counted} seen by the "
                        f"probes); precision {facts['precision']}, accumulate_grad_batches "
                        f"{facts['accumulate_grad_batches']}, gradient_clip_val {facts['gradient_clip_val']}, "
                        f"strategy {facts['strategy']}" + _norm_summary(facts))
    note = clip_note(facts, f"Trainer(gradient_clip_val={facts['gradient_clip_val']})")
    if note:
        facts["note"] = note
    return facts


def _norm_summary(facts: dict[str, Any]) -> str:
    if "grad_norm_before_clip_median" not in facts:
        return ""
    text = (f"; gradient norm before clipping median {facts['grad_norm_before_clip_median']:.4g}, max "
            f"{facts['grad_norm_before_clip_max']:.4g} ({facts['grad_norm_samples']} steps")
    if "clipped_fraction" in facts:
        text += f", {facts['clipped_fraction']:.0%} clipped"
    return text + ")"


def _make_lightning_callback() -> type:
    base = _lightning_base()

    class LightningCallback(base):  # type: ignore[misc, valid-type]
        """Probe a Lightning `trainer.fit()`: `L.Trainer(callbacks=[torchdoctor.LightningCallback()])`."""

        def __init__(self, steps: int | None = None, probes: Any = None, out: Any = None, show: bool = True):
            super().__init__()
            self._td = _Session("lightning", steps, probes, out, show)
            self._norms: list[float] = []

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage == "fit":  # before configure_optimizers: the probes see the optimizers and schedulers made
                self._norms = []
                self._td.begin(f"Lightning Trainer.fit({type(pl_module).__name__})")
                self._td.watch_owner(pl_module, "training_step")

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            # Lightning calls this after backward and unscaling, before its own clipping: the norm it will clip.
            # Measured on the first 20 steps, then every 10th (one pass over the gradients each).
            step = trainer.global_step
            if self._td.watch is not None and (step < 20 or step % 10 == 0):
                norm = _total_norm(pl_module.parameters())
                if norm is not None:
                    self._norms.append(norm)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self._td.steps is not None and trainer.global_step >= self._td.steps:
                trainer.should_stop = True

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage == "fit":
                steps = self._td.steps
                stopped = steps is not None and trainer.global_step >= steps
                self._td.end("steps" if stopped else "completed", 0,
                             facts=lightning_facts(trainer, self._td.counted(), self._norms))

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            reason, code = _ended_how(exception)
            self._td.end(reason, code, exc=exception,
                         facts=lightning_facts(trainer, self._td.counted(), self._norms))

        def report(self) -> Any:
            """The Report of the last fit (None before one ended)."""
            return self._td.last.report() if self._td.last is not None else None

    LightningCallback.__module__ = __name__
    return LightningCallback


# -- Hugging Face Trainer ------------------------------------------------------------------------------


def _hf_base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError("torchdoctor.TrainerCallback needs transformers: pip install 'torchdoctor[hf]'") from None
    return TrainerCallback


def trainer_facts(args: Any, state: Any, counted: int) -> dict[str, Any]:
    """What the Trainer knows about the train() that just ended."""
    global_step = int(getattr(state, "global_step", 0) or 0)
    precision = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"
    facts: dict[str, Any] = {
        "framework": "hf-trainer",
        "framework_steps": global_step,
        "probe_steps": counted,
        "precision": precision,
        "gradient_accumulation_steps": getattr(args, "gradient_accumulation_steps", None),
        "max_grad_norm": getattr(args, "max_grad_norm", None),
        "optim": str(getattr(getattr(args, "optim", ""), "value", getattr(args, "optim", ""))),
        "lr_scheduler_type": str(getattr(getattr(args, "lr_scheduler_type", ""), "value", getattr(args, "lr_scheduler_type", ""))),
        "torch_compile": bool(getattr(args, "torch_compile", False)),
        "output_dir": getattr(args, "output_dir", None),
    }
    # The Trainer logs the norm before clipping (clip_grad_norm_'s return value) at every logging step.
    logged = [row.get("grad_norm") for row in getattr(state, "log_history", None) or [] if isinstance(row, dict)]
    facts.update(clip_facts([n for n in logged if n is not None], facts["max_grad_norm"]))
    facts["summary"] = (f"Trainer: {global_step} optimizer steps by state.global_step ({counted} seen by the probes); "
                        f"{precision}, gradient_accumulation_steps {facts['gradient_accumulation_steps']}, "
                        f"max_grad_norm {facts['max_grad_norm']}, optim {facts['optim']}" + _norm_summary(facts))
    note = clip_note(facts, f"TrainingArguments(max_grad_norm={facts['max_grad_norm']})")
    if note:
        facts["note"] = note
    return facts


def _make_trainer_callback() -> type:
    base = _hf_base()

    class TrainerCallback(base):  # type: ignore[misc, valid-type]
        """Probe a Hugging Face `trainer.train()`: `Trainer(callbacks=[torchdoctor.TrainerCallback()])`."""

        def __init__(self, steps: int | None = None, probes: Any = None, out: Any = None, show: bool = True):
            self._td = _Session("hf-trainer", steps, probes, out, show)
            self._args: Any = None
            self._state: Any = None

        def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # train() builds the optimizer and the scheduler before its first hook (on_train_begin): the session
            # starts here, at Trainer(...), so the probes see them made.
            self._args, self._state = args, state
            self._begin(kwargs.get("model"))

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._args, self._state = args, state
            if self._td.watch is None:  # a second train() with the same Trainer
                self._begin(kwargs.get("model"))

        def _begin(self, model: Any) -> None:
            trainer = _calling_trainer()
            self._td.begin(f"transformers Trainer({type(model).__name__ if model is not None else ''})", trainer)
            self._td.watch_owner(trainer, "compute_loss", "training_step")
            # Trainer(optimizers=(optimizer, scheduler)): made by the user before the session started
            self._td.adopt_scheduler(getattr(trainer, "lr_scheduler", None))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._td.steps is not None and state.global_step >= self._td.steps:
                control.should_training_stop = True

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps = self._td.steps
            stopped = steps is not None and state.global_step >= steps
            self._td.end("steps" if stopped else "completed", 0,
                         facts=trainer_facts(args, state, self._td.counted()))

        def report(self) -> Any:
            """The Report of the last train() (None before one ended)."""
            if self._td.watch is not None:  # train() raised: the Trainer has no hook for that
                self._td.end("exception", 1, facts=trainer_facts(self._args, self._state, self._td.counted()))
            return self._td.last.report() if self._td.last is not None else None

    TrainerCallback.__module__ = __name__
    return TrainerCallback


def _calling_trainer() -> Any:
    """The Trainer whose hook is running: `self` of the nearest transformers.Trainer method on the stack (the
    callback's hooks are not given the Trainer itself)."""
    trainer_class = getattr(sys.modules.get("transformers.trainer"), "Trainer", None)
    frame = sys._getframe(1)
    while frame is not None and trainer_class is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, trainer_class):
            return owner
        frame = frame.f_back
    return None


_FACTORIES = {"LightningCallback": _make_lightning_callback, "TrainerCallback": _make_trainer_callback}


def __getattr__(name: str) -> Any:
    factory = _FACTORIES.get(name)
    if factory is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _CLASSES:
        _CLASSES[name] = factory()
    return _CLASSES[name]

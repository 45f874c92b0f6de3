"""The probe API: how an instrument plugs into `torchdoctor run`.

A probe has two halves that share one name:

1. the instrument, a `Probe` subclass in `probes/<name>.py`. It lives inside
   the script's process (in every rank) and writes evidence events to the
   run directory while the script runs;
2. the analysis, `doctor/analysis/<name>.py` with `analyse(run) -> Analysis`.
   It runs in the parent after the script ended — also after a crash, a
   SIGKILL or a hang, because it reads only the streamed events — and turns
   the events into symptoms, measured numbers and notes. It never imports
   torch.

Adding a probe
--------------

1. `probes/<name>.py`: a `Probe` subclass with `name = "<name>"`; override
   only the hooks you need. Document in the module docstring what it
   measures, what it costs, and the thresholds of each symptom it raises.
2. `doctor/analysis/<name>.py`: `def analyse(run: RunEvidence) -> Analysis`
   (see `torchdoctor.analysis`).
3. One `ProbeInfo` row in `PROBES` (`probes/__init__.py`).
4. Thresholds in `rules/data/thresholds.toml` under `[<name>]` (read in the
   analysis with `run.limits("<name>")`), instrument budgets under
   `[<name>.instrument]` (they arrive as `self.options`).
5. Tests: a real script that shows each symptom and a healthy one that must
   not (`tests/test_run_<name>.py`, scripts in `tests/fixtures/run/`).

Life cycle, inside the script's process
---------------------------------------

``__init__(session)``
    once, right after the script's own ``import torch`` has finished
    (``ProbeInfo.needs_torch``, the default) or before the script starts
    (``needs_torch=False``: the module must not import torch at top level).
``install()``
    attach hooks (module hooks, wrappers, allocator history…).
``before_step(step, optimizer)``
    the optimizer step pre-hook; ``step`` is the number the step will have.
    The step's gradients are complete here: for ``optimizer.step(closure)``
    (Lightning, LBFGS), whose closure computes them inside the step, it runs
    once the closure's first call has returned.
``after_step(step, optimizer) -> dict | None``
    the optimizer step post-hook (the step is done). Return a small dict of
    per-step numbers: it is stored in that step's event under the probe's
    name. This runs every step: keep it to microseconds and never force a
    host-device sync here.
``on_exception(exc)``
    the script raised (before the traceback is printed): capture state that
    is gone a moment later (an OOM's allocator snapshot).
``finish(reason)``
    the script ended; ``reason`` is one of completed, steps, exit,
    exception, interrupted, terminated. Not called after SIGKILL or a
    segfault: stream what matters as it happens.

A step is an optimizer step of the primary optimizer (the first one that
steps; another optimizer is taken when that one is garbage-collected), seen
through PyTorch's global optimizer hooks, so plain, Hugging Face-style and
Lightning-style loops all count the same. Only hooks a probe overrides are
called. Every call is guarded: an exception in a probe is recorded as a
``probe-error`` event, disables that probe for the rest of the run and never
reaches the script.

A probe with nothing more to do in a step hook (a one-off check done, a
probe inert in this process) says so with
``self.session.stop_calling(self, "before_step" | "after_step")``.

Helpers: ``self.emit(kind, **fields)``, ``self.note(text)``,
``self.artifact(name, path)``, ``self.artifact_path("x.pickle")`` (a per-rank
file in the run directory), ``self.options``, ``self.step``, ``self.rank``,
``self.user_frames()``, ``self.is_user_file(path)``, ``self.session``.

Example: a learning-rate probe, both halves::

    # probes/lr.py
    class LearningRateProbe(Probe):
        name = "lr"

        def after_step(self, step, optimizer):
            return {"lr": optimizer.param_groups[0]["lr"]}

    # doctor/analysis/lr.py
    def analyse(run: RunEvidence) -> Analysis:
        out = Analysis()
        steps, lrs = run.series("lr", "lr")
        if lrs and max(lrs) == 0:
            out.symptoms.append(run.symptom(
                "loss-not-decreasing", probe="lr",
                summary="the learning rate was 0 for every step",
                values={"steps": len(lrs)}))
        out.measurements = {"lr_last": lrs[-1]} if lrs else {}
        return out
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar

from torchdoctor.probes.userframes import is_library_file, is_user_file

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor.probes.session import Session


class Probe:
    """Base class of every run-time probe (see the module docstring)."""

    name: ClassVar[str] = ""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.options: dict[str, Any] = dict(session.options_for(self.name))
        self.enabled = True

    # -- hooks (override what you need) -------------------------------------

    def install(self) -> None:
        """Attach hooks; called once after __init__."""

    def before_step(self, step: int, optimizer: Any) -> None:
        """Optimizer step pre-hook of the primary optimizer."""

    def after_step(self, step: int, optimizer: Any) -> dict[str, Any] | None:
        """Optimizer step post-hook; return per-step numbers for the step event."""
        return None

    def on_exception(self, exc: BaseException) -> None:
        """The script raised `exc` (uncaught)."""

    def finish(self, reason: str) -> None:
        """The script ended for `reason`."""

    # -- helpers ---------------------------------------------------------------

    @property
    def step(self) -> int:
        """Optimizer steps completed so far."""
        return self.session.step

    @property
    def rank(self) -> int:
        return self.session.rank

    def emit(self, kind: str, **fields: Any) -> None:
        """Append one event to this rank's evidence stream."""
        self.session.emit(kind, probe=self.name, **fields)

    def note(self, text: str) -> None:
        """A sentence for the report's notes (e.g. an instrument that degraded)."""
        self.emit("note", text=text)

    def artifact_path(self, filename: str) -> str:
        """A per-rank path in the run directory: 'snap.pickle' -> '<run>/snap.rank0.pickle'."""
        return self.session.file_for(filename)

    def artifact(self, name: str, path: str) -> None:
        """Name a file the report lists under `artifacts`."""
        self.emit("artifact", name=name, path=path)

    def is_user_file(self, path: str) -> bool:
        return is_user_file(path, self.session.project)

    def user_frames(self, start: FrameType | None = None) -> list[FrameType]:
        """The user's frames on the current stack, innermost first (library frames skipped)."""
        frame = start or sys._getframe(1)
        out: list[FrameType] = []
        while frame is not None:
            if not is_library_file(frame.f_code.co_filename):
                out.append(frame)
            frame = frame.f_back
        return out

"""`torchdoctor.watch()`: the probes of `torchdoctor run`, inside the current process, around a block.

    import torchdoctor

    with torchdoctor.watch(steps=200) as session:
        train(model, loader)          # any training code: a plain loop, trainer.fit(), trainer.train()
    session.report()                  # the same Report `torchdoctor run` builds

One implementation with `run`: the block gets the same `Session`
(probes/session.py) the bootstrap starts in a child, with the same
configuration (`RunPlan.child_config()`); its evidence streams to a run
directory the same way; on exit the runner's own `evidence_of` and
`build_report` (doctor/runner.py) turn it into the Report, and report.json is
written next to the evidence. What differs is only what a process of our own
gives: no timeout, no hang watchdog, no fault handler, and the session ends
when the block does — after which the process is as it was (probes/restore.py).

`steps=N` ends the block after N optimizer steps, as `--steps N` ends a
script: the `StopRun` raised inside `optimizer.step()` is caught at the end
of the `with`, so the code after it runs. An exception of the block is
diagnosed, then re-raised unchanged.

Importing this module does not import torch; `watch()` does, when the
session starts. Under `torchdoctor run` (the bootstrap already probes the
process) a `watch()` block measures nothing of its own and says so: the run's
probes measure it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from torchdoctor.model import Report

_active: Watch | None = None  # one session at a time: the optimizer hooks are process-wide


class Watch:
    """One in-process probing session; use it as a context manager, or `start()` and `stop()`."""

    def __init__(self, steps: int | None = None, probes: list[str] | tuple[str, ...] | str | None = None,
                 out: str | os.PathLike | None = None, show: bool = True, label: str | None = None,
                 where: tuple[str, int] | None = None, framework: str | None = None) -> None:
        self.steps = steps
        self.probes = [probes] if isinstance(probes, str) else list(probes or [])
        self.out = os.fspath(out) if out is not None else None
        self.show = show
        self.framework = framework  # "lightning" | "hf-trainer" when a framework's callback started it
        self._where = where
        self._label = label
        self._plan: Any = None
        self._session: Any = None
        self._started = 0.0
        self._report: Report | None = None
        self.skipped: str | None = None  # why this block is not measured by its own session
        self.facts: dict[str, Any] = {}  # what a framework's callback knows (its own step count, settings)

    # -- the session ------------------------------------------------------------------------------

    def start(self) -> Watch:
        global _active
        if self._session is not None or self._report is not None:
            raise RuntimeError("this torchdoctor.watch() session has already been started; make a new one")
        from torchdoctor.probes.session import ENV

        if os.environ.get(ENV):  # inside `torchdoctor run`: the bootstrap's session already probes everything
            self.skipped = "this process runs under `torchdoctor run`, whose probes measure the block"
            return self
        if _active is not None:
            raise RuntimeError("a torchdoctor.watch() session is already running in this process; end it first")
        from torchdoctor.run_options import UsageError, runs_base, watch_plan

        path, line = self._where or _caller()
        script = path if path.endswith(".py") and os.path.isfile(path) else None
        cwd = os.getcwd()
        label = self._label or _label_for(path, line, cwd)
        out = self.out
        rank, world = _rank()
        if world > 1:
            # Every process of a launcher (torchrun, accelerate launch) runs the block: each gets its own run
            # directory and report (their events never mix), and only rank 0 prints.
            # One folder for the job: torchrun's run id is the same in every rank (ranks start seconds apart).
            job = os.environ.get("TORCHELASTIC_RUN_ID") or time.strftime("%Y%m%d-%H%M%S")
            try:
                base = Path(out) if out is not None else runs_base(cwd) / "runs" / f"watch-{job}"
            except UsageError as exc:
                raise ValueError(f"torchdoctor.watch(): {exc}") from None
            out = str(base / f"rank{rank}")
            self.show = self.show and rank == 0
        try:
            self._plan = watch_plan(self.probes, self.steps, out, cwd, script, label)
        except UsageError as exc:
            raise ValueError(f"torchdoctor.watch(): {exc}") from None
        import torch  # noqa: F401 - the probes that need torch install now, before the block runs

        from torchdoctor.probes.session import Session

        config = self._plan.child_config()
        self._session = Session(config, in_process=True)
        _active = self
        self._started = time.perf_counter()
        try:
            self._session.start(label)
        except BaseException:
            self._close()
            raise
        return self

    def stop(self, reason: str = "completed", code: int = 0) -> Report | None:
        """End the session (how the block ended: completed, steps, exception, interrupted) and build the Report."""
        if self._session is None:
            return self._report
        session = self._session
        try:
            session.finish(reason, code)
        finally:
            self._close()
        self._report = self._build(code)
        if self.show:
            self.render(stream=sys.stderr)
        return self._report

    def _close(self) -> None:
        global _active
        session, self._session = self._session, None
        if _active is self:
            _active = None
        if session is not None:
            session.close()

    def _build(self, code: int) -> Report:
        from torchdoctor import runner
        from torchdoctor.run_process import ChildResult

        plan = self._plan
        result = ChildResult(returncode=code, decided=None, duration_s=time.perf_counter() - self._started)
        run = runner.evidence_of(plan, result)
        try:
            report = runner.build_report(plan, run)
        except Exception as exc:  # noqa: BLE001 - the user's process must never die of our diagnosis
            if os.environ.get("TORCHDOCTOR_DEBUG"):
                raise
            report = runner._fallback_report(plan, run, exc)
        if self.facts and report.run is not None:
            facts = dict(self.facts)
            if facts.get("note"):
                report.notes.append(str(facts.pop("note")))
            report.run.measurements["framework"] = facts
            own, seen = self.facts.get("framework_steps"), self.facts.get("probe_steps")
            if isinstance(own, int) and isinstance(seen, int) and own != seen:
                report.notes.append(f"The framework counted {own} optimizer steps and the probes {seen}: an "
                                    "optimizer step outside torch.optim's hooks, or a step the framework skipped "
                                    "(a GradScaler's inf/NaN skip), makes them differ.")
        runner.write_report(report, plan.run_dir, run.events)
        return report

    def __enter__(self) -> Watch:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if self._session is None:
            return False
        from torchdoctor.probes.session import StopRun

        if kind is None:
            self.stop("completed", 0)
            return False
        if issubclass(kind, StopRun):
            self.stop("steps", 0)
            return True  # --steps N: the block ends here, the code after it runs
        if issubclass(kind, KeyboardInterrupt):
            self.stop("interrupted", 130)
            return False
        if issubclass(kind, SystemExit):
            status = exc.code if isinstance(exc, SystemExit) else None
            self.stop("exit", 0 if status is None else status if isinstance(status, int) else 1)
            return False
        session = self._session
        try:
            session.record_exception(exc)
            session.notify_exception(exc)
        except Exception:  # noqa: BLE001 - the user's exception comes first
            pass
        self.stop("exception", 1)
        return False  # the block's own exception goes on, unchanged

    # -- the result -------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._session is not None

    @property
    def run_dir(self) -> Path | None:
        return self._plan.run_dir if self._plan is not None else None

    @property
    def steps_counted(self) -> int:
        """Optimizer steps seen so far (while running) or in the whole block (after it)."""
        if self._session is not None:
            return int(self._session.step)
        return self._report.run.steps_completed if self._report is not None and self._report.run else 0

    def report(self) -> Report | None:
        """The Report of the block; ends the session first if it is still running. None when skipped."""
        if self._session is not None:
            self.stop("completed", 0)
        return self._report

    def render(self, fmt: str = "text", stream: TextIO | None = None, details: bool = False) -> None:
        """Print the report: text (terminal), json or markdown, as `torchdoctor run --format`; text is the
        summary, and the full report after it with `details` (as `run --details`)."""
        report = self.report()
        if report is None:
            (stream or sys.stderr).write(f"torchdoctor.watch(): nothing measured here: {self.skipped}\n")
            return
        from torchdoctor.render import render

        render(report, fmt, stream, details=details)

    def write(self, path: str | os.PathLike) -> Path:
        """Write the report to `path`: .json, .html (the run's page, as report.html) or .md by its suffix."""
        from torchdoctor.render import to_json, to_markdown
        from torchdoctor.render.html_page import page

        report = self.report()
        if report is None:
            raise RuntimeError(f"torchdoctor.watch(): no report: {self.skipped}")
        target = Path(path)

        def to_page(report: Report) -> str:
            return page(report, self.run_dir, written_to=target.resolve().parent)

        writers = {".json": to_json, ".html": to_page, ".htm": to_page, ".md": to_markdown}
        if target.suffix.lower() not in writers:
            raise ValueError(f"torchdoctor.watch(): write a .json, .html or .md file, not {target.name!r}")
        target.write_text(writers[target.suffix.lower()](report) + "\n", encoding="utf-8")
        return target

    def __repr__(self) -> str:
        report = self._report
        if report is None or report.run is None:
            state = "running" if self._session is not None else (self.skipped or "not started")
            return f"<torchdoctor.watch: {state}>"
        found = ", ".join(f"{s.id} ({s.severity})" for s in report.symptoms) or "no symptoms"
        return f"<torchdoctor.watch: {report.run.steps_completed} steps, {report.run.stopped}; {found}>"

    def _repr_html_(self) -> str:
        report = self._report
        if report is None:
            state = "running" if self._session is not None else (self.skipped or "not started")
            return f"<p>torchdoctor.watch(): {state}</p>"
        from torchdoctor.render.html_page import charts_fragment

        # The summary, then the same per-step charts as the run's report.html (loss, memory, step time, ...).
        return report._repr_html_() + charts_fragment(report, self.run_dir)


def watch(steps: int | None = None, probes: list[str] | tuple[str, ...] | str | None = None,
          out: str | os.PathLike | None = None, show: bool = True) -> Watch:
    """Probe a block of training code in this process; the block's Report comes out at its end.

    steps: end the block after this many optimizer steps (like `run --steps`).
    probes: probe names as `run --probe` takes them (default: the default probes; "all"; "none").
    out: the run directory (default: .torchdoctor/runs/<time> under the working directory).
    show: print the report to stderr when the block ends.
    """
    frame = sys._getframe(1)
    return Watch(steps=steps, probes=probes, out=out, show=show,
                 where=(frame.f_code.co_filename, frame.f_lineno))


def _rank() -> tuple[int, int]:
    try:
        return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        return 0, 1


def _caller() -> tuple[str, int]:
    """The first frame outside torchdoctor: where the session was started."""
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(ours):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("<unknown>", 0)


def _label_for(path: str, line: int, cwd: str) -> str:
    from torchdoctor.probes.userframes import display_path

    if path.startswith("<") or "ipykernel_" in path:
        return "torchdoctor.watch() in a notebook cell"
    return f"torchdoctor.watch() at {display_path(path, cwd)}:{line}"

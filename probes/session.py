"""One rank's probing session: evidence stream, step counting, probes, fault capture.

`Session.from_env()` reads the run configuration the runner put in the
TORCHDOCTOR_RUN environment variable (JSON), so the same session starts in a
script launched by `python -m torchdoctor.probes.bootstrap …` and, through the
environment, in every rank of a torchrun job. The bootstrap (bootstrap.py)
creates one, calls `start()`, runs the script and reports how it ended with
`record_exception()` / `finish()`.

What the session itself records (the runner's own events, no `probe` field):
start, torch (the script imported torch), step, exception, finishing (the
script has ended; the probes write their last evidence), exit, probe-error
(docs/run.md).
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from types import TracebackType
from typing import Any

from torchdoctor.probes import PROBES, heartbeat
from torchdoctor.probes.base import Probe
from torchdoctor.probes.evidence import EvidenceWriter
from torchdoctor.probes.importwatch import when_imported
from torchdoctor.probes.stepfile import open_step_file
from torchdoctor.probes.userframes import pick_user_frame

ENV = "TORCHDOCTOR_RUN"
CONFIG_VERSION = 1


class StopRun(BaseException):
    """Raised from the optimizer post-hook once `--steps N` steps are done.

    A BaseException, so a script's `except Exception:` does not swallow it;
    its `finally:` blocks and context managers still run.
    """


class Terminated(BaseException):
    """SIGTERM from the runner (--timeout, a hang, a second Ctrl-C): end cleanly."""


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Session:
    def __init__(self, config: dict[str, Any], in_process: bool = False):
        # in_process: torchdoctor.watch() inside the user's own process (doctor/watching.py). The process is
        # not ours: no fault handler or SIGTERM handler of ours, and `close()` undoes what the probes changed.
        self.in_process = in_process
        self.config = config
        self.run_dir: str = config["run_dir"]
        self.project: str | None = config.get("project")
        self.steps_limit: int | None = config.get("steps")
        self.probe_names: list[str] = list(config.get("probes", []))
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.pid = os.getpid()
        self.t0 = time.perf_counter()
        os.makedirs(self.run_dir, exist_ok=True)
        self.writer = EvidenceWriter(self.file_for("events.jsonl"), self.t0)
        self.steps_file = open_step_file(self.file_for("steps.jsonl"))  # None: steps go to the events
        heartbeat.start(self.file_for("heartbeat.bin"))  # the watchdog's evidence of life between steps
        self.step = 0
        self.probes: list[Probe] = []
        self._pre: list[Probe] = []
        self._post: list[Probe] = []
        self._stopped: set[tuple[int, str]] = set()  # (id(probe), hook) a probe no longer needs (stop_calling)
        self._primary: weakref.ref | None = None
        # Another optimizer that steps this many times in a row while the primary one is idle takes over (a second
        # training phase while the first phase's optimizer is still referenced, by its scheduler for instance).
        # Well above the steps a GAN critic takes per generator step (n_critic = 5).
        self.takeover_steps = int(config.get("primary_takeover_steps", 32))
        self._other: weakref.ref | None = None
        self._other_steps = 0
        self._hooked = False
        self._ended = False
        self._pending: tuple[int, Any] | None = None  # a step(closure) whose pre-step probes wait for it
        self._files: list[Any] = []  # keep faulthandler's files open for the whole run
        self._children = 0  # processes the script started with multiprocessing (DataLoader workers aside)
        self._ledger: Any = None  # in-process: what torch looked like before the probes (probes/restore.py)
        self._owners: list[tuple[weakref.ref, dict[str, Any]]] = []  # see watch_owner()

    @classmethod
    def from_env(cls) -> Session:
        return cls(read_config())

    # -- files and events --------------------------------------------------------

    def file_for(self, filename: str) -> str:
        """'events.jsonl' -> '<run_dir>/events.rank<R>.jsonl'."""
        return rank_file(self.run_dir, filename, self.rank)

    def emit(self, kind: str, probe: str | None = None, **fields: Any) -> None:
        event: dict[str, Any] = {"kind": kind}
        if probe:
            event["probe"] = probe
        event["step"] = self.step
        event.update(fields)
        self.writer.write(event)

    def options_for(self, probe: str) -> dict[str, Any]:
        return self.config.get("options", {}).get(probe, {})

    # -- start -----------------------------------------------------------------

    def start(self, target: str) -> None:
        """Fault capture, signal handling, the start event; probes once torch is imported."""
        if not self.in_process:
            self._faulthandler()
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._on_sigterm)
        self.emit(
            "start",
            pid=self.pid,
            host=socket.gethostname(),
            rank=self.rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            target=target,
            argv=list(sys.argv),
            cwd=os.getcwd(),
            project=self.project,
            python=sys.version.split()[0],
            executable=sys.executable,
            probes=self.probe_names,
            steps_limit=self.steps_limit,
            time=time.time(),
            main_thread=threading.main_thread().ident,
        )
        os.register_at_fork(after_in_child=self._forked)
        self._watch_child_processes()
        early = [n for n in self.probe_names if not self._needs_torch(n)]
        self._load(early)
        when_imported("torch", self._torch_imported)

    def _faulthandler(self) -> None:
        crash = open(self.file_for("crash.txt"), "w")  # noqa: SIM115 - must outlive this call
        self._files.append(crash)
        faulthandler.enable(crash, all_threads=True)
        if hasattr(signal, "SIGUSR1"):
            stacks = open(self.file_for("stacks.txt"), "w")  # noqa: SIM115
            self._files.append(stacks)
            faulthandler.register(signal.SIGUSR1, stacks, all_threads=True, chain=False)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.pid:  # a forked DataLoader worker: die as it would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self._ended:  # already writing the last evidence; the runner's SIGKILL bounds the wait
            return
        raise Terminated()

    def _watch_child_processes(self) -> None:
        """Record the processes the script starts with multiprocessing, DataLoader workers aside.

        Training run there (torch.multiprocessing.spawn, Lightning's ddp_spawn and ddp_fork strategies) is out
        of the probes' reach: a spawned interpreter never loads them, and a forked child stops counting. The
        report says so instead of reading the empty run as a script that trains nothing.
        """
        import multiprocessing
        from multiprocessing.process import BaseProcess

        from torchdoctor.probes.sites import here
        from torchdoctor.probes.transparent import transparent

        original = BaseProcess.start
        session = self

        def start(process: Any) -> Any:
            try:
                if os.getpid() == session.pid and session._children < 8:
                    target = getattr(process, "_target", None)
                    name = f"{getattr(target, '__module__', '') or ''}.{getattr(target, '__qualname__', '') or ''}"
                    if not name.startswith("torch.utils.data."):
                        session._children += 1
                        method = (getattr(type(process), "_start_method", None)
                                  or multiprocessing.get_start_method(allow_none=True) or "default")
                        session.emit("child-process", method=method, target=name.strip("."), site=here())
            except Exception:  # noqa: BLE001 - recording must never stop the script's own start
                pass
            return original(process)

        start.__wrapped__ = original  # type: ignore[attr-defined]
        BaseProcess.start = transparent(start)

    def _forked(self) -> None:
        # Forked workers inherit the hooks; only the rank's main process counts steps (and beats).
        self._ended = True
        heartbeat.stop()

    @staticmethod
    def _needs_torch(name: str) -> bool:
        info = PROBES.get(name)
        return info.needs_torch if info is not None else False

    def _torch_imported(self, torch_module: Any) -> None:
        if self.in_process:
            from torchdoctor.probes.restore import Ledger

            self._ledger = Ledger()
            self._ledger.snapshot()
        self.emit("torch", version=str(getattr(torch_module, "__version__", "")))
        late = [n for n in self.probe_names if self._needs_torch(n)]
        self._load(late)
        self._hook_optimizers()

    def _load(self, names: list[str]) -> None:
        for name in names:
            info = PROBES.get(name)
            if info is None:
                self.emit("probe-error", probe=name, where="load", error=f"unknown probe {name!r}")
                continue
            try:
                probe = _probe_class(info.instrument)(self)
                probe.install()
            except Exception as exc:  # noqa: BLE001 - a broken probe must not stop the script
                self.emit("probe-error", probe=name, where="install", error=_describe(exc))
                continue
            self.probes.append(probe)
        self._pre = [p for p in self.probes
                     if type(p).before_step is not Probe.before_step and (id(p), "before_step") not in self._stopped]
        self._post = [p for p in self.probes
                      if type(p).after_step is not Probe.after_step and (id(p), "after_step") not in self._stopped]

    def stop_calling(self, probe: Probe, hook: str) -> None:
        """`probe` has nothing more to do in `hook` ("before_step" or "after_step") for the rest of the run: the
        session stops calling it there. Every step calls each probe's hooks, and a call that only returns still
        costs its frame, cold after a training step's kernels."""
        if hook not in ("before_step", "after_step"):
            raise ValueError(f"unknown step hook {hook!r}")
        self._stopped.add((id(probe), hook))  # also for the lists that loading the next probes builds again
        if hook == "before_step":
            self._pre = [p for p in self._pre if p is not probe]  # a new list: a loop over the old one goes on
        else:
            self._post = [p for p in self._post if p is not probe]

    def _hook_optimizers(self) -> None:
        if self._hooked:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(self._pre_hook)
        register_optimizer_step_post_hook(self._post_hook)
        self._hooked = True

    # -- steps -----------------------------------------------------------------

    def _is_primary(self, optimizer: Any) -> bool:
        current = self._primary() if self._primary is not None else None
        if current is None:
            try:
                self._primary = weakref.ref(optimizer)
            except TypeError:
                return True
            return True
        return current is optimizer

    def _count_other(self, optimizer: Any) -> None:
        """Before each optimizer step: a run of steps of one other optimizer while the primary is idle."""
        current = self._primary() if self._primary is not None else None
        if current is None or current is optimizer:
            self._other_steps = 0
            return
        other = self._other() if self._other is not None else None
        if other is optimizer:
            self._other_steps += 1
        else:
            try:
                self._other = weakref.ref(optimizer)
            except TypeError:
                return
            self._other_steps = 1
        if self._other_steps >= self.takeover_steps:
            self._primary, self._other, self._other_steps = self._other, None, 0
            self.emit("primary-optimizer", optimizer=type(optimizer).__name__, after_steps=self.takeover_steps)

    def _pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        heartbeat.beat()  # any optimizer's step is training activity, the primary's or not
        if not self._ended:
            self._count_other(optimizer)
        if self._ended or not self._pre or not self._is_primary(optimizer):
            return None
        step = self.step + 1
        closure = _closure_of(args, kwargs)
        if closure is None:
            self._before_step(step, optimizer)
            return None
        # step(closure): the closure runs forward and backward inside the step (Lightning's automatic
        # optimization, LBFGS), so the gradients the pre-step probes read exist only once it has returned.
        # They run after its first call; if the optimizer never calls it, the post-hook runs them.
        self._pending = (step, optimizer)

        def closure_then_probes(*c_args: Any, **c_kwargs: Any) -> Any:
            result = closure(*c_args, **c_kwargs)
            self._run_pending()
            return result

        return _replace_closure(args, kwargs, closure_then_probes)

    def _run_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._before_step(*pending)

    def _before_step(self, step: int, optimizer: Any) -> None:
        for probe in self._pre:
            if probe.enabled:
                try:
                    probe.before_step(step, optimizer)
                except Exception as exc:  # noqa: BLE001
                    self._disable(probe, "before_step", exc)

    def _post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        heartbeat.beat()
        if self._ended or not self._is_primary(optimizer):
            return
        self._run_pending()
        self.step += 1
        step = self.step
        fields: dict[str, Any] = {}
        for probe in self._post:
            if not probe.enabled:
                continue
            try:
                found = probe.after_step(step, optimizer)
            except Exception as exc:  # noqa: BLE001
                self._disable(probe, "after_step", exc)
                continue
            if found:
                fields[probe.name] = found
        self._write_step(step, fields)
        if self.steps_limit and step >= self.steps_limit:
            raise StopRun(f"torchdoctor: stopping after {step} optimizer steps (--steps {self.steps_limit})")

    def _write_step(self, step: int, fields: dict[str, Any]) -> None:
        steps = self.steps_file
        if steps is not None and not steps.failed:
            try:
                line = self.writer.step_line(step, fields)
            except (TypeError, ValueError):
                return
            steps.write(line)
            if not steps.failed:
                return
            # the disk filled up mid-record: this one and the next go to the event stream
        self.writer.write({"kind": "step", "step": step, **fields})

    def _disable(self, probe: Probe, where: str, exc: BaseException) -> None:
        probe.enabled = False
        self.emit("probe-error", probe=probe.name, where=where, error=_describe(exc), at=_our_frame(exc))

    # -- the end -----------------------------------------------------------------

    def record_exception(self, exc: BaseException) -> None:
        """The script's uncaught exception as evidence: type, message, frames, the user's frame."""
        summary = traceback.extract_tb(exc.__traceback__)
        frames = [
            {"path": f.filename, "line": f.lineno, "function": f.name, "code": (f.line or "").strip() or None}
            for f in summary
            if not f.filename.startswith(os.path.dirname(__file__))
        ][-40:]
        user = pick_user_frame([(f["path"], f["line"], f["function"]) for f in frames], self.project)
        user_frame = next((f for f in reversed(frames) if user and (f["path"], f["line"]) == user[:2]), None)
        try:
            message = str(exc)
        except Exception:  # noqa: BLE001 - a broken __str__ must not hide the rest
            message = "<unprintable>"
        text = "".join(traceback.format_exception(type(exc), exc, trim_traceback(exc.__traceback__)))
        self.emit(
            "exception",
            type=type(exc).__name__,
            module=type(exc).__module__,
            message=message[:4000],
            traceback=text[-20000:],
            frames=frames,
            user_frame=user_frame,
        )

    def notify_exception(self, exc: BaseException) -> None:
        for probe in self.probes:
            if probe.enabled and type(probe).on_exception is not Probe.on_exception:
                try:
                    probe.on_exception(exc)
                except Exception as err:  # noqa: BLE001
                    self._disable(probe, "on_exception", err)

    def finish(self, reason: str, code: int | None = None) -> None:
        """Let every probe write its final evidence, then the exit event (once)."""
        if self._ended:
            return
        self._ended = True
        # The script is done: what follows is the probes' end-of-run work (gradcheck can take its whole time
        # budget). The supervisor stops its hang clock until the exit event, so this is never taken for a hang.
        self.emit("finishing", reason=reason)
        for probe in self.probes:
            if probe.enabled and type(probe).finish is not Probe.finish:
                try:
                    probe.finish(reason)
                except Exception as exc:  # noqa: BLE001
                    self._disable(probe, "finish", exc)
        if self.steps_file is not None:
            self.steps_file.close()
        self.emit("exit", reason=reason, code=code)

    def watch_owner(self, owner: Any, method: Any) -> bool:
        """Scan `owner`'s attributes for tensors held across steps, as `self.<name>` in the user's `method`.

        A framework calls the user's training_step / compute_loss and returns before the optimizer step, so
        no frame of it is on the stack when the memory probe scans: a framework callback names the object
        and the method here. False (nothing registered) when the method is not the user's own code."""
        from torchdoctor.probes.userframes import is_library_file

        code = getattr(getattr(method, "__func__", method), "__code__", None)
        if code is None or is_library_file(code.co_filename):
            return False
        try:
            ref = weakref.ref(owner)
        except TypeError:
            return False
        where = {"path": code.co_filename, "function": code.co_name, "firstlineno": code.co_firstlineno,
                 "lineno": code.co_firstlineno}
        self._owners.append((ref, where))
        return True

    def holder_owners(self) -> list[tuple[Any, dict[str, Any]]]:
        return [(obj, where) for ref, where in self._owners if (obj := ref()) is not None]

    def close(self) -> None:
        """In-process: after `finish()`, leave the user's process as it was before `start()`."""
        heartbeat.stop()
        for probe in self.probes:
            probe.enabled = False
        if self._ledger is not None:
            ledger, self._ledger = self._ledger, None
            for failure in ledger.restore():
                self.emit("probe-error", where="restore", error=f"could not restore {failure}"[:500])
        self.writer.close()
        for fh in self._files:
            fh.close()


def _closure_of(args: Any, kwargs: Any) -> Any:
    """The closure an `optimizer.step(closure)` call passes (positionally or by name), or None.

    The hook's `args` start with the optimizer itself (torch passes `step`'s full argument tuple)."""
    closure = kwargs.get("closure") if kwargs else None
    if closure is None and len(args) > 1:
        closure = args[1]
    return closure if callable(closure) else None


def _replace_closure(args: Any, kwargs: Any, closure: Any) -> tuple[Any, Any]:
    """The step's (args, kwargs) with its closure replaced, where the caller put it."""
    if kwargs and kwargs.get("closure") is not None:
        return tuple(args), {**kwargs, "closure": closure}
    return (args[0], closure, *tuple(args)[2:]), dict(kwargs or {})


def read_config() -> dict[str, Any]:
    """The run configuration from TORCHDOCTOR_RUN (JSON)."""
    raw = os.environ.get(ENV)
    if not raw:
        raise RuntimeError(f"{ENV} is not set: the bootstrap is started by `torchdoctor run`")
    return json.loads(raw)


def rank_file(run_dir: str, filename: str, rank: int) -> str:
    """'events.jsonl' -> '<run_dir>/events.rank<R>.jsonl'."""
    stem, dot, suffix = filename.partition(".")
    return os.path.join(run_dir, f"{stem}.rank{rank}{dot}{suffix}")


def _probe_class(spec: str) -> type[Probe]:
    module_name, _, class_name = spec.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def _our_frame(exc: BaseException) -> str | None:
    """The innermost torchdoctor line the exception passed through: what a bug report about a probe needs."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    at = None
    tb = exc.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if path.startswith(package):
            at = f"{os.path.relpath(path, package)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return at


def trim_traceback(tb: TracebackType | None) -> TracebackType | None:
    """Drop the bootstrap's own leading frames, so the traceback reads like plain Python's."""
    ours = os.path.dirname(__file__)
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(ours):
        tb = tb.tb_next
    return tb

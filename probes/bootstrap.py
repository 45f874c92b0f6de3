"""Start a script under the probes: `python -m torchdoctor.probes.bootstrap SCRIPT ARGS…`.

Also `… bootstrap -m MODULE ARGS…`, like `python -m`. The run configuration
comes from the TORCHDOCTOR_RUN environment variable (see session.py), so a
launcher that passes the environment on (torchrun: `torchrun … -m
torchdoctor.probes.bootstrap train.py …`) starts a probed session in every
rank.

The script runs as Python would run it:

- `sys.argv` is `[SCRIPT, ARGS…]` as typed (for `-m`, argv[0] is the
  module's file, as with `python -m`);
- `sys.path[0]` is the script's directory (resolved), or the working
  directory for `-m` (unless PYTHONSAFEPATH / -P is set);
- the script is the `__main__` module for the rest of the process, with an
  absolute `__file__` and no `__spec__` (modules: `runpy`, as `python -m`);
- an uncaught exception prints the same traceback (through sys.excepthook,
  without the bootstrap's frames) and exits with 1; `sys.exit(n)` exits
  with n; Ctrl-C prints the KeyboardInterrupt traceback and exits with 130.

Differences from plain Python, all documented in docs/run.md: `--steps N`
ends the script from inside `optimizer.step()` of step N with a
BaseException (`StopRun`), exit 0; SIGTERM raises `Terminated` so the
probes can write their last evidence (exit 143).

Under torchrun (the configuration says `"launcher": "torchrun"` and RANK is
set) the bootstrap first forks: the child is the rank and runs the script;
the parent only waits for it and appends a `process-exit` event (exit code or
fatal signal, wall-clock time) to the rank's stream, then ends the same way
(same code, or the same signal re-raised), so torchrun sees what it would have
seen. Only the parent of a process learns how it ended, and torchrun's agent
is the parent of the ranks: without this a rank that aborts in interpreter
shutdown, segfaults or is killed leaves no trace in the evidence. The waiter
ignores the catchable signals (torchrun and torchdoctor signal the rank's
whole process group, so the rank still receives them).

The run dies with torchdoctor even when torchdoctor is killed outright
(lifetime.py): under torchrun the waiter dies with torchrun's agent and the
rank with the waiter; the processes the script forks from its main thread
get SIGTERM when their parent dies.
"""

from __future__ import annotations

import builtins
import io
import os
import runpy
import signal
import sys
import time
import types
from dataclasses import dataclass
from typing import Any

from torchdoctor import lifetime
from torchdoctor.probes.evidence import EvidenceWriter
from torchdoctor.probes.session import Session, StopRun, Terminated, rank_file, read_config, trim_traceback


@dataclass
class Target:
    module: str | None  # `-m MODULE`
    script: str | None  # the script path as typed
    args: list[str]

    @property
    def display(self) -> str:
        return f"-m {self.module}" if self.module else str(self.script)


def parse_target(argv: list[str]) -> Target:
    if not argv:
        raise ValueError("usage: python -m torchdoctor.probes.bootstrap (SCRIPT | -m MODULE) [ARGS…]")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ValueError("-m needs a module name")
        return Target(module=argv[1], script=None, args=argv[2:])
    return Target(module=None, script=argv[0], args=argv[1:])


def _fresh_main() -> types.ModuleType:
    """A new `__main__` module, so the script never shares globals with the bootstrap."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return main


def _run_script(path: str) -> None:
    """What `python path` does for a .py file (runpy for a directory or zip with __main__.py)."""
    real = os.path.abspath(path)
    if not sys.flags.safe_path:
        sys.path[0] = os.path.dirname(os.path.realpath(path))
    if os.path.isdir(real) or not real.endswith((".py", ".pyw")) and _is_zip(real):
        sys.path[0] = real
        runpy.run_path(real, run_name="__main__")
        return
    from importlib.machinery import SourceFileLoader

    main = _fresh_main()
    main.__file__ = real
    main.__loader__ = SourceFileLoader("__main__", real)
    main.__spec__ = None
    main.__package__ = None
    main.__cached__ = None  # type: ignore[attr-defined]
    with io.open_code(real) as fh:
        source = fh.read()
    code = compile(source, real, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


def _run_module(name: str) -> None:
    """What `python -m name` does."""
    _fresh_main()
    run_as_main = getattr(runpy, "_run_module_as_main", None)
    if run_as_main is not None:
        run_as_main(name, alter_argv=True)
    else:  # pragma: no cover - every CPython since 2.7 has it
        runpy.run_module(name, run_name="__main__", alter_sys=True)


def _print_exception(exc: BaseException) -> None:
    exc.__traceback__ = trim_traceback(exc.__traceback__)
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except Exception:  # noqa: BLE001 - a broken custom hook: fall back to Python's
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
    sys.stderr.flush()


def set_argv(target: Target) -> None:
    if target.module:
        sys.argv = [target.module, *target.args]  # runpy puts the module's file in argv[0]
    else:
        sys.argv = [str(target.script), *target.args]


def run(session: Session, target: Target) -> int:
    """Run the target as `__main__`; return the process exit code (SystemExit propagates)."""
    try:
        if target.module:
            _run_module(target.module)
        elif session.config.get("notebook"):  # `torchdoctor run notebook.ipynb` (probes/notebook.py)
            from torchdoctor.probes.notebook import run_cells

            run_cells(session.config["notebook"], _fresh_main())
        else:
            _run_script(str(target.script))
    except StopRun:
        session.finish("steps", 0)
        return 0
    except SystemExit as exc:
        session.finish("exit", _exit_status(exc.code))
        raise
    except KeyboardInterrupt as exc:
        session.finish("interrupted", 130)
        _print_exception(exc)
        return 130
    except Terminated:
        session.finish("terminated", 143)
        return 143
    except BaseException as exc:  # noqa: BLE001 - the script's own failure is evidence
        session.record_exception(exc)
        session.notify_exception(exc)
        _print_exception(exc)
        session.finish("exception", 1)
        return 1
    session.finish("completed", 0)
    return 0


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1  # sys.exit("message") prints the message and exits with 1


_WAITER_IGNORES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def record_exit_status(config: dict[str, Any], t0: float) -> None:
    """Under torchrun: fork; return in the child (the rank); the parent records how it ended and exits alike."""
    rank = int(os.environ.get("RANK", "0") or 0)
    path = rank_file(config["run_dir"], "events.jsonl", rank)
    sys.stdout.flush()
    sys.stderr.flush()
    waiter = os.getpid()
    pid = os.fork()
    if pid == 0:
        lifetime.die_with_parent(waiter)  # the waiter dies only of SIGKILL: so does the rank, at once
        return
    for name in _WAITER_IGNORES:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:  # pragma: no cover - nothing else reaps it
            os._exit(1)
    code = os.waitstatus_to_exitcode(status)
    died_of = signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None
    try:
        writer = EvidenceWriter(path, t0)
        writer.write({"kind": "process-exit", "rank": rank, "rank_pid": pid, "code": code, "signal": died_of,
                      "time": time.time()})
        writer.close()
    except OSError:
        pass
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)  # a signal that does not end a process by default (it ended the rank)
    os._exit(code)


def bind_to_supervisor(config: dict[str, Any]) -> None:
    """Die with torchdoctor, even when it is killed outright (SIGKILL: a CI timeout, the OOM killer).

    One process: torchdoctor's preexec set the death signal before the exec; nothing to do. Under
    torchrun this process's parent is torchrun's agent (which dies with torchdoctor the same way):
    its pid is not known here, so the race check is that the chain above is whole — torchdoctor
    still there and not our parent (a subreaper adopts the orphans of a dead agent), nor init.
    """
    supervisor = os.environ.get(lifetime.SUPERVISOR_ENV, "")
    if config.get("launcher") == "torchrun" and supervisor.isdigit():
        lifetime.die_with_parent(None, watched=int(supervisor))


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    try:
        target = parse_target(list(sys.argv[1:] if argv is None else argv))
        config = read_config()
        bind_to_supervisor(config)
        if config.get("launcher") == "torchrun" and "RANK" in os.environ:
            record_exit_status(config, t0)
        lifetime.chain_to_forks()
        session = Session(config)
    except (ValueError, RuntimeError, KeyError) as exc:
        sys.stderr.write(f"torchdoctor bootstrap: {exc}\n")
        return 2
    set_argv(target)
    session.start(target.display)
    return run(session, target)


if __name__ == "__main__":
    sys.exit(main())

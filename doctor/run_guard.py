"""The run's guard: a small process that ends the run if torchdoctor dies without ending it itself.

`python -m torchdoctor.run_guard SUPERVISOR_PID`, started by the supervisor
in a session of its own, with a pipe from torchdoctor as its standard input.
torchdoctor writes `group PGID` for each process group of the run it learns
of and `done` once it has cleaned up. End of file without `done` means
torchdoctor was killed (SIGKILL from a CI timeout, the OOM killer): the
kernel closes the pipe of a dead process, whatever killed it.

The death signals (lifetime.py) already end the script, the torchrun job and
the workers the script forked. What they cannot reach is what the script
started with an exec — `subprocess`, multiprocessing's `spawn` and
`forkserver` workers, a detached child —: the death signal does not survive
a fork. Every one of those inherits TORCHDOCTOR_SUPERVISOR=<pid> in its
environment, and the guard ends each process that carries it, and the
groups it was told of: SIGTERM, then SIGKILL after `GRACE_S`.

No torch, and nothing of torchdoctor but this file: it must start in tens of
milliseconds.
"""

from __future__ import annotations

import os
import signal
import sys
import time

GRACE_S = 2.0


def run_processes(supervisor: int) -> list[int]:
    """Every process whose environment names this supervisor (the guard itself aside)."""
    import psutil

    marker = str(supervisor)
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get("TORCHDOCTOR_SUPERVISOR") == marker:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def end_run(supervisor: int, groups: set[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = run_processes(supervisor)
        for pid in pids:
            _kill(os.kill, pid, sig)
        for pgid in groups:
            _kill(os.killpg, pgid, sig)
        if sig == signal.SIGKILL:
            return
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.05)


def _kill(send, target: int, sig: int) -> None:
    try:
        send(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def main() -> int:
    for name in ("SIGINT", "SIGHUP", "SIGTERM"):  # only torchdoctor's end (the pipe's) ends the guard
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    supervisor = int(sys.argv[1])
    groups: set[int] = set()
    for line in sys.stdin:
        word, _, value = line.strip().partition(" ")
        if word == "done":
            return 0
        if word == "group" and value.isdigit():
            groups.add(int(value))
    end_run(supervisor, groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())

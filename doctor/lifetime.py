"""Tie the run's processes to torchdoctor's life: Linux prctl(2) switches, through ctypes.

- `become_subreaper()`: orphans of the script (a child started with
  `start_new_session=True`, a daemon's double fork, DataLoader workers whose
  main process died) re-parent to torchdoctor instead of init, so the
  supervisor sees them as its descendants and ends them with the run.
- `die_with_parent()`: PR_SET_PDEATHSIG, a signal when the parent *thread*
  exits (torchdoctor killed by a CI timeout or the OOM killer), then the
  check for the race: a parent already gone before the call was made never
  sends the signal, so the process exits itself. The death signal survives
  execve but not fork: each link of a chain sets its own
  (`chain_to_forks()`).

Elsewhere (macOS, a kernel or seccomp policy that refuses prctl) every
function returns False and the run goes on with the process-group clean-up
alone. No torch, no psutil: the bootstrap calls this before the script runs.
"""

from __future__ import annotations

import os
import signal
import sys

SUPERVISOR_ENV = "TORCHDOCTOR_SUPERVISOR"  # torchdoctor's pid, in the script's environment

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

_prctl = None


def _libc_prctl():
    """libc's prctl, or None off Linux (looked up once, before any fork: the child only calls it)."""
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            import ctypes

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False
    return _prctl or None


def available() -> bool:
    """Is prctl there? Looks libc up now: call it before a fork whose child will use it."""
    return _libc_prctl() is not None


def prctl(option: int, arg: int) -> bool:
    fn = _libc_prctl()
    if fn is None:
        return False
    import ctypes

    zero = ctypes.c_ulong(0)
    return fn(option, ctypes.c_ulong(arg), zero, zero, zero) == 0


def subreaper() -> bool:
    """Is this process a child subreaper now?"""
    fn = _libc_prctl()
    if fn is None:
        return False
    import ctypes

    value = ctypes.c_int(0)
    zero = ctypes.c_ulong(0)
    return fn(PR_GET_CHILD_SUBREAPER, ctypes.byref(value), zero, zero, zero) == 0 and value.value != 0


def become_subreaper(on: bool = True) -> bool:
    """Make orphaned descendants re-parent to this process (on=False: undo). False where unsupported."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def die_with_parent(expected_parent: int | None, watched: int | None = None,
                    sig: int = signal.SIGKILL) -> bool:
    """`sig` to this process when its parent thread exits; exit now if the parent is already gone.

    `expected_parent`: the pid the parent had before this process was made (a fork: the forking
    process). `watched`: a process further up the chain (torchdoctor), for a child that cannot know
    its parent's pid: if it is gone, or became our parent by adopting us, the chain is broken.
    Returns whether the death signal is set.
    """
    if not prctl(PR_SET_PDEATHSIG, int(sig)):
        return False
    parent = os.getppid()
    if expected_parent is not None and parent != expected_parent:
        os._exit(1)  # the parent died before the death signal was armed: it will never come
    if watched is not None and (parent in (1, watched) or not _exists(watched)):
        os._exit(1)
    return True


def chain_to_forks(sig: int = signal.SIGTERM) -> None:
    """Every process this one forks from its main thread gets `sig` when this one dies, and so on down.

    Forks only (multiprocessing's default `fork` start method: DataLoader workers, Pool workers;
    os.fork): fork runs the at-fork hooks, which the child inherits, so the chain goes on below.
    The death signal fires when the forking *thread* exits, so a fork from any other thread is left
    out: that thread may end long before the process. SIGTERM, not SIGKILL: on a normal end of the
    parent its workers may still clean up (shared memory, temporary files); one that ignores SIGTERM
    is ended by the supervisor's clean-up after the run.
    """
    import threading

    forking: list[int | None] = [None]

    def before() -> None:
        forking[0] = os.getpid() if threading.current_thread() is threading.main_thread() else None

    def after_in_child() -> None:
        if forking[0] is not None:
            die_with_parent(forking[0], sig=sig)

    os.register_at_fork(before=before, after_in_child=after_in_child)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""A counter of training activity, shared with the supervisor: the hang watchdog's evidence of life.

A step is an optimizer step, but a healthy script can go far longer than
--hang-timeout without one: a long validation or generation pass, an
evaluation over a big set, a checkpoint being written. Progress is any
training activity — a top-level forward of a tracked model
(probes/forwards.py), a backward (probes/patches.py), an optimizer step of
any optimizer (the session's hooks) — and, read from outside by the
supervisor, the script's own output (doctor/run_process.py). The watchdog
fires only when all of them stop.

The counter is 8 bytes of `heartbeat.rank<R>.bin` mapped shared into the
process: a beat is one in-memory increment (~0.1 µs), no system call, no
event; the supervisor reads the 8 bytes at each poll and sees a changed
value. The blocks are reserved with `posix_fallocate` before the mapping, so
a full disk fails here as an OSError and never as a SIGBUS on a store; where
the file cannot be made, beats are no-ops and the watchdog falls back to
steps and output. A forked worker stops beating (the mapping is inherited;
only the rank's main process speaks for the rank). No torch import.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

SIZE = 8

_counter: ctypes.c_uint64 | None = None
_map: mmap.mmap | None = None


def start(path: str) -> bool:
    """Create and map the counter at `path`; False where it cannot (beats are then no-ops)."""
    global _counter, _map
    if not hasattr(os, "posix_fallocate"):
        return False
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, 0, SIZE)
        _map = mmap.mmap(fd, SIZE)
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)
    _counter = ctypes.c_uint64.from_buffer(_map)
    return True


def beat() -> None:
    """One unit of training activity."""
    counter = _counter
    if counter is not None:
        counter.value += 1


def stop() -> None:
    """Beat no more (a forked worker; the end of the run). The mapping stays: dropping it would need every
    ctypes view of it gone first."""
    global _counter
    _counter = None


def read(path: str) -> int | None:
    """The counter's value as the supervisor sees it; None while there is no file (yet)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(SIZE)
    except OSError:
        return None
    return int.from_bytes(data, sys.byteorder) if len(data) == SIZE else None  # c_uint64: native order

"""The evidence stream: JSON Lines appended with one write() per event.

Each event is serialised and handed to the kernel with a single `os.write`
on a file opened with O_APPEND, so once `emit` returns the line survives a
crash, a SIGKILL or a hang of the process: nothing measured is lost, and no
flush is needed. Lines from several threads or forked workers never
interleave.

The per-step records go to their own file, `steps.rank<R>.jsonl`, through a
memory mapping (probes/stepfile.py): no system call per step.

Format (one object per line; see docs/run.md):

    {"kind": "step", "t": 12.5031, "step": 7, "memory": {"rss_mib": 412.3}}

- `kind`  what happened (start, step, exception, exit, note, artifact,
          probe-error, or a probe's own kinds such as census, holders, oom)
- `t`     seconds since the bootstrap started (time.perf_counter)
- `probe` the probe that wrote it (absent for the runner's own events)
- `step`  optimizer steps completed when it was written
- `pid`   only when written by a process other than the rank's main one
Non-finite floats are written as NaN / Infinity (Python's json reads them).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def _plain(value: Any) -> Any:
    """JSON fallback for the odd objects probes hand over (torch.Size, dtype, Path…)."""
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


_ENCODE = json.JSONEncoder(separators=(",", ":"), default=_plain).encode


class EvidenceWriter:
    """Appends events to `events.rank<R>.jsonl` in the run directory."""

    def __init__(self, path: str, t0: float | None = None):
        self.path = path
        self.t0 = time.perf_counter() if t0 is None else t0
        self.pid = os.getpid()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.failed = False

    def now(self) -> float:
        return round(time.perf_counter() - self.t0, 6)

    def line(self, event: dict[str, Any]) -> bytes:
        """The event as one JSON line, with its time (and pid, from another process). Raises TypeError or
        ValueError for a value JSON cannot hold."""
        if "t" not in event:
            event["t"] = self.now()
        pid = os.getpid()
        if pid != self.pid:
            event["pid"] = pid
        return (_ENCODE(event) + "\n").encode("utf-8", "replace")

    def write(self, event: dict[str, Any]) -> None:
        try:
            os.write(self._fd, self.line(event))
        except (OSError, TypeError, ValueError):
            # A full disk or an unserialisable value must never break the user's run.
            self.failed = True

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass

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

# This process's pid, kept current across fork() without a system call per event: lines written by a
# forked DataLoader worker say which process wrote them.
_PID = [os.getpid()]


def _refresh_pid() -> None:
    _PID[0] = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_refresh_pid)

_KEYS: dict[str, str] = {}  # field name -> '"name":' (step records reuse a handful of names)


def _key(name: str) -> str:
    text = _ENCODE(str(name)) + ":"
    if len(_KEYS) < 4096:
        _KEYS[name] = text
    return text


def _float(value: float) -> str:
    """A float as json writes it (NaN, Infinity and -Infinity for the non-finite)."""
    if value - value == 0.0:
        return float.__repr__(value)
    if value != value:
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


class EvidenceWriter:
    """Appends events to `events.rank<R>.jsonl` in the run directory."""

    def __init__(self, path: str, t0: float | None = None):
        self.path = path
        self.t0 = time.perf_counter() if t0 is None else t0
        self.pid = _PID[0]
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.failed = False

    def now(self) -> float:
        return round(time.perf_counter() - self.t0, 6)

    def line(self, event: dict[str, Any]) -> bytes:
        """The event as one JSON line, with its time (and pid, from another process). Raises TypeError or
        ValueError for a value JSON cannot hold."""
        if "t" not in event:
            event["t"] = self.now()
        if _PID[0] != self.pid:
            event["pid"] = _PID[0]
        return (_ENCODE(event) + "\n").encode("utf-8", "replace")

    def step_line(self, step: int, fields: dict[str, dict[str, Any]]) -> bytes:
        """A step record, `{"kind":"step","step":N,"t":T,<probe>:{…},…}`, built by hand.

        It is written after every optimizer step, when the interpreter's code is cold: there the json
        module's encoder and a `round()` cost ~40-50 µs, this ~20 (the time as integer microseconds needs
        no float formatting). Same JSON as `line()` would give, values of other types through it.
        Raises TypeError or ValueError like `line()`.
        """
        us = int((time.perf_counter() - self.t0) * 1e6)
        seconds, micro = divmod(us, 1_000_000)
        head = f'{{"kind":"step","step":{step},"t":{seconds}.{micro:06d}'
        if _PID[0] != self.pid:
            head += f',"pid":{_PID[0]}'
        parts = [head]
        keys = _KEYS
        for name, values in fields.items():
            parts.append(",")
            parts.append(keys.get(name) or _key(name))
            if type(values) is not dict:
                parts.append(_ENCODE(values))
                continue
            opening = "{"
            for key, value in values.items():
                kind = type(value)
                if kind is float:
                    text = _float(value)
                elif kind is int:
                    text = int.__repr__(value)
                else:
                    text = _ENCODE(value)
                parts.append(opening)
                parts.append(keys.get(key) or _key(key))
                parts.append(text)
                opening = ","
            parts.append("{}" if opening == "{" else "}")
        parts.append("}\n")
        return "".join(parts).encode("utf-8", "replace")

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

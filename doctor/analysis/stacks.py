"""Read faulthandler's dumps: every thread's Python stack, innermost frame first.

The format (CPython's faulthandler, unchanged since 3.3):

    Fatal Python error: Segmentation fault          <- only for a fatal signal

    Thread 0x00007fb485b846c0 (most recent call first):
      File "/tmp/train.py", line 6 in worker
      ...
    Current thread 0x00007fb4867c7b80 (most recent call first):
      File "/tmp/train.py", line 12 in <module>

The thread id is the `threading.get_ident()` of that thread, so the start
event's `main_thread` tells which stack is the main thread's. A file may hold
several dumps (SIGUSR1 twice): the last one wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<path>.*)", line (?P<line>\d+) in (?P<function>.*?)\s*$')
_FATAL = re.compile(r"^Fatal Python error: (?P<what>.+)$", re.MULTILINE)


@dataclass
class Thread:
    ident: int
    current: bool
    frames: list[tuple[str, int, str]] = field(default_factory=list)  # (path, line, function), innermost first


@dataclass
class Dump:
    threads: list[Thread]
    fatal: str | None = None  # "Segmentation fault" when the dump came from a fatal signal

    def thread(self, ident: int | None) -> Thread | None:
        for t in self.threads:
            if t.ident == ident:
                return t
        return None

    def main(self, main_ident: int | None) -> Thread | None:
        """The main thread's stack: by id, else the current thread, else the first."""
        return self.thread(main_ident) or next((t for t in self.threads if t.current), None) or (
            self.threads[0] if self.threads else None
        )


def parse(text: str) -> Dump | None:
    dumps: list[list[Thread]] = [[]]
    current: Thread | None = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            ident = int(m.group(2), 16)
            if any(t.ident == ident for t in dumps[-1]):
                dumps.append([])  # the same thread again: a new dump begins
            current = Thread(ident=ident, current=m.group(1) == "Current thread")
            dumps[-1].append(current)
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            current.frames.append((m.group("path"), int(m.group("line")), m.group("function")))
    threads = dumps[-1]
    if not threads:
        return None
    fatal = _FATAL.findall(text)
    return Dump(threads=threads, fatal=fatal[-1].strip() if fatal else None)


def format_thread(thread: Thread, limit: int = 12) -> str:
    lines = [f'  File "{p}", line {n} in {f}' for p, n, f in thread.frames[:limit]]
    if len(thread.frames) > limit:
        lines.append(f"  … {len(thread.frames) - limit} more frames")
    return "\n".join(lines)

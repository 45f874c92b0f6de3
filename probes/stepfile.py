"""The per-step records, written without a system call: a file mapped into memory.

Every optimizer step writes one record (`{"kind":"step",…}`: the step, its
time and the probes' per-step numbers). As an `os.write` that is one system
call per step, and right after a training step's kernels the kernel's own
code and data are cold: 15-60 µs on a CPU loop whose step takes 3 ms, 1-2%
of it for nothing measured. So the records go to `steps.rank<R>.jsonl`
through a shared memory mapping instead: a write is a copy into the page
cache, which belongs to the kernel the moment it is made, so a crash, a
SIGKILL or a hang still loses nothing, and the supervisor reads the records
as they are written.

The file grows in chunks of `CHUNK` bytes whose blocks are reserved with
`posix_fallocate` before they are mapped (a full disk then fails there, as
an OSError, never as a SIGBUS on a store). `close()` cuts the file to what
was written; a process that dies first leaves NUL bytes after its last
record, which readers drop (`records_in`). Where mapping or reserving is not
possible (no `posix_fallocate`, a filesystem that refuses), `open_step_file`
returns None and the session writes the records to the event stream, as
before: readers take step records from either file.
"""

from __future__ import annotations

import mmap
import os

CHUNK = 256 * 1024  # ~1700 records; a new chunk costs three system calls; at most this much of RSS is ours


class StepFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._map: mmap.mmap | None = None
        self._base = 0  # file offset of the mapped chunk
        self._pos = 0  # bytes written in it
        self.failed = False
        try:
            self._map_chunk(0)
        except (OSError, ValueError):
            os.close(self._fd)
            raise

    def _map_chunk(self, base: int) -> None:
        os.posix_fallocate(self._fd, base, CHUNK)
        self._map = mmap.mmap(self._fd, CHUNK, offset=base)
        self._base, self._pos = base, 0

    def write(self, line: bytes) -> None:
        """Append one record (a JSON line ending in a newline)."""
        if self.failed or self._map is None:
            return
        end = self._pos + len(line)
        if end <= CHUNK:
            self._map[self._pos:end] = line
            self._pos = end
            return
        try:
            while line:  # across chunk boundaries: the bytes stay contiguous in the file
                room = CHUNK - self._pos
                if room == 0:
                    self._map.close()
                    self._map = None
                    self._map_chunk(self._base + CHUNK)
                    continue
                part, line = line[:room], line[room:]
                self._map[self._pos:self._pos + len(part)] = part
                self._pos += len(part)
        except (OSError, ValueError):
            self.failed = True  # a full disk: the step records stop, the user's run goes on

    @property
    def size(self) -> int:
        return self._base + self._pos

    def close(self) -> None:
        """Unmap and cut the file to the records written."""
        if self._map is not None:
            self._map.close()
            self._map = None
        try:
            os.ftruncate(self._fd, self.size)
        except OSError:
            pass
        try:
            os.close(self._fd)
        except OSError:
            pass


def open_step_file(path: str) -> StepFile | None:
    """A mapped step file, or None where this platform or filesystem cannot give one."""
    if not hasattr(os, "posix_fallocate"):
        return None
    try:
        return StepFile(path)
    except (OSError, ValueError):
        try:
            os.unlink(path)
        except OSError:
            pass
        return None


def records_in(data: bytes) -> tuple[list[bytes], int]:
    """The complete lines in bytes read from a step file, and how many bytes they take.

    A mapped file is longer than its records while it is written (and after a
    SIGKILL): they end at the first NUL byte. A line still being copied has no
    newline yet and is left for the next read.
    """
    nul = data.find(b"\x00")
    if nul != -1:
        data = data[:nul]
    end = data.rfind(b"\n") + 1
    return (data[:end].split(b"\n")[:-1] if end else []), end

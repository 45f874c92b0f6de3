"""A finished run as the analysis sees it: events per rank, how it ended, the limits.

Pure Python, no torch. `read_events` tolerates a last line cut short (a disk
filled up mid-write); `EventTail` follows the streams while the script runs,
for the supervisor's watchdog.
"""

from __future__ import annotations

import json
import linecache
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchdoctor.model import Evidence, Location, Symptom
from torchdoctor.probes.heartbeat import read as read_heartbeat
from torchdoctor.probes.stepfile import records_in
from torchdoctor.probes.userframes import display_path
from torchdoctor.rules import catalog

_RANK_FILE = re.compile(r"^events\.rank(\d+)\.jsonl$")
_STEP_FILE = re.compile(r"^steps\.rank(\d+)\.jsonl$")
_HEARTBEAT_FILE = re.compile(r"^heartbeat\.rank(\d+)\.bin$")
STEP_READ = 16384  # bytes of a step file read at a time while it is written (~100 records)


def _rank_files(run_dir: str | Path, pattern: re.Pattern[str]) -> dict[int, Path]:
    out: dict[int, Path] = {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return out
    for name in names:
        m = pattern.match(name)
        if m:
            out[int(m.group(1))] = Path(run_dir) / name
    return dict(sorted(out.items()))


def event_files(run_dir: str | Path) -> dict[int, Path]:
    return _rank_files(run_dir, _RANK_FILE)


def step_files(run_dir: str | Path) -> dict[int, Path]:
    """The per-step records (probes/stepfile.py), one file per rank."""
    return _rank_files(run_dir, _STEP_FILE)


def heartbeat_files(run_dir: str | Path) -> dict[int, Path]:
    """The activity counters (probes/heartbeat.py), one file per rank."""
    return _rank_files(run_dir, _HEARTBEAT_FILE)


def bytes_written(pid: int) -> int | None:
    """What a process's main thread has written so far (`wchar` of /proc/<pid>/task/<pid>/io: its output, its
    files, its pipes); None where /proc does not say.

    The main thread's own counter, not the process's: a logger or progress thread that keeps printing while
    the main thread is stuck (a deadlock, a collective that never returns) is no training activity. Training
    in another thread still shows through the heartbeat (its forwards, backwards and steps)."""
    for path in (f"/proc/{pid}/task/{pid}/io", f"/proc/{pid}/io"):
        try:
            with open(path, "rb") as fh:
                for line in fh:
                    if line.startswith(b"wchar:"):
                        return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return None


def _rows(lines: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for raw in lines:
        try:
            row = json.loads(raw)
        except ValueError:
            continue  # a line cut short
        if isinstance(row, dict) and "kind" in row:
            rows.append(row)
    return rows


def read_events(run_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's events with its step records merged in, in time order; unreadable lines are skipped."""
    events: dict[int, list[dict[str, Any]]] = {}
    for rank, path in event_files(run_dir).items():
        with open(path, "rb") as fh:
            events[rank] = _rows(fh)
    for rank, path in step_files(run_dir).items():
        try:
            lines, _ = records_in(path.read_bytes())
        except OSError:
            continue
        steps = _rows(lines)
        if steps:
            events[rank] = _merge(events.get(rank, []), steps)
    return events


def _merge(events: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step records placed among the events by time (both carry the session's clock); the events keep
    their own order, and a step written at the same time as an event comes after it."""
    out: list[dict[str, Any]] = []
    i = 0
    for event in events:
        t = event.get("t")
        if isinstance(t, (int, float)):
            while i < len(steps) and _time(steps[i]) < t:
                out.append(steps[i])
                i += 1
        out.append(event)
    out.extend(steps[i:])
    return out


def _time(row: dict[str, Any]) -> float:
    t = row.get("t")
    return float(t) if isinstance(t, (int, float)) else 0.0


class EventTail:
    """Follows `events.rank*.jsonl` and `steps.rank*.jsonl` while the script runs: steps, start events (pids)."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = run_dir
        self.offsets: dict[tuple[str, int], int] = {}
        self.partial: dict[int, bytes] = {}
        self.steps: dict[int, int] = {}
        self.pids: dict[int, int] = {}
        self.finishing: set[int] = set()  # ranks whose script has ended while their probes finish
        self.exited: set[int] = set()
        self.beats: dict[int, int] = {}  # rank -> its activity counter (probes/heartbeat.py)
        self.written: dict[int, int] = {}  # rank -> bytes its main process had written

    def poll(self) -> bool:
        """Read what was appended since the last call; True on progress: a new optimizer step, other
        training activity (a forward of a tracked model, a backward: the heartbeat counters), the script's
        own output, or a rank's probes finishing their end-of-run work (the hang clock starts again)."""
        progressed = self._poll_steps()
        progressed = self._poll_activity() or progressed
        for rank, path in event_files(self.run_dir).items():
            data = self._new_bytes(path, ("events", rank))
            if not data:
                continue
            lines = (self.partial.get(rank, b"") + data).split(b"\n")
            self.partial[rank] = lines.pop()
            for line in lines:
                if line.startswith(b'{"kind":"step"'):  # no step file on this platform: steps come here
                    self.steps[rank] = self.steps.get(rank, 0) + 1
                    progressed = True
                elif line.startswith(b'{"kind":"start"'):
                    try:
                        self.pids[rank] = int(json.loads(line)["pid"])
                    except (ValueError, KeyError, TypeError):
                        pass
                elif line.startswith(b'{"kind":"finishing",'):
                    self.finishing.add(rank)
                elif line.startswith((b'{"kind":"exit",', b'{"kind":"process-exit",')):
                    self.finishing.discard(rank)
                    self.exited.add(rank)
                    progressed = True
        return progressed

    def _poll_activity(self) -> bool:
        """Heartbeat counters that moved, and main processes that wrote (output, files) since the last poll."""
        active = False
        for rank, path in heartbeat_files(self.run_dir).items():
            value = read_heartbeat(str(path))
            if value is not None and value != self.beats.get(rank, 0):
                self.beats[rank] = value
                active = True
        for rank, pid in self.pids.items():
            written = bytes_written(pid)
            if written is None:
                continue
            if rank in self.written and written != self.written[rank]:
                active = True
            self.written[rank] = written
        return active

    def _poll_steps(self) -> bool:
        progressed = False
        for rank, path in step_files(self.run_dir).items():
            key = ("steps", rank)
            limit = STEP_READ
            while True:
                # A mapped file is longer than its records (NUL-padded to the next chunk): read a slice at a
                # time, so a poll reads what was written since the last one, not the padding.
                offset = self.offsets.get(key, 0)
                data = self._new_bytes(path, key, advance=False, limit=limit)
                lines, used = records_in(data)
                self.offsets[key] = offset + used  # a record still being copied is read next time
                count = sum(1 for line in lines if line.startswith(b'{"kind":"step"'))
                if count:
                    self.steps[rank] = self.steps.get(rank, 0) + count
                    progressed = True
                if len(data) < limit or b"\x00" in data:
                    break
                limit = limit if used else limit * 2  # a record longer than the slice: read more of it
        return progressed

    def _new_bytes(self, path: Path, key: tuple[str, int], advance: bool = True, limit: int | None = None) -> bytes:
        try:
            size = path.stat().st_size
        except OSError:
            return b""
        offset = self.offsets.get(key, 0)
        if size <= offset:
            return b""
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(size - offset if limit is None else min(limit, size - offset))
        except OSError:
            return b""
        if advance:
            self.offsets[key] = offset + len(data)
        return data

    def only_finishing(self) -> bool:
        """No rank still runs its script and at least one is in its probes' end-of-run work."""
        return bool(self.finishing) and set(self.pids) <= self.finishing | self.exited


@dataclass
class Outcome:
    """How the script ended (decided by analysis/outcome.py)."""

    stopped: str  # a value of rules/data/stopped.toml (doctor/stopped.py)
    exit_code: int | None
    signal: str | None
    duration_s: float
    seconds_without_step: float | None = None
    hang_timeout_s: float | None = None
    timeout_s: float | None = None
    notes: list[str] = field(default_factory=list)
    leftovers: list[dict] = field(default_factory=list)  # the supervisor's leftover processes (run_process.py)


@dataclass
class RunEvidence:
    run_dir: Path
    cwd: str
    target: str  # as the user named it: "train.py" or "-m pkg.train"
    project: str | None  # the script's directory (or the working directory for -m)
    probes: list[str]
    events: dict[int, list[dict[str, Any]]]
    outcome: Outcome
    thresholds: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # e.g. gpu_memory_gib

    # -- looking things up --------------------------------------------------------

    @property
    def ranks(self) -> list[int]:
        return sorted(self.events) or [0]

    @property
    def world_size(self) -> int:
        start = self.start(self.ranks[0])
        return int(start.get("world_size", 1)) if start else max(len(self.events), 1)

    def limits(self, section: str) -> dict[str, Any]:
        """A table of rules/data/thresholds.toml, e.g. limits('memory')."""
        return self.thresholds.get(section, {})

    def of_kind(self, kind: str, probe: str | None = None, rank: int | None = None) -> list[dict[str, Any]]:
        ranks = self.ranks if rank is None else [rank]
        return [
            e
            for r in ranks
            for e in self.events.get(r, [])
            if e.get("kind") == kind and (probe is None or e.get("probe") == probe)
        ]

    def start(self, rank: int = 0) -> dict[str, Any] | None:
        found = self.of_kind("start", rank=rank)
        return found[0] if found else None

    def exit_event(self, rank: int = 0) -> dict[str, Any] | None:
        found = self.of_kind("exit", rank=rank)
        return found[-1] if found else None

    def steps(self, rank: int = 0) -> list[dict[str, Any]]:
        return self.of_kind("step", rank=rank)

    def steps_completed(self, rank: int = 0) -> int:
        steps = self.steps(rank)
        return int(steps[-1]["step"]) if steps else 0

    def series(self, probe: str, key: str, rank: int = 0) -> tuple[list[int], list[float]]:
        """(steps, values) of a per-step number a probe returned from after_step."""
        xs: list[int] = []
        ys: list[float] = []
        for e in self.steps(rank):
            fields = e.get(probe)
            if isinstance(fields, dict) and isinstance(fields.get(key), (int, float)):
                xs.append(int(e["step"]))
                ys.append(float(fields[key]))
        return xs, ys

    def rank_of(self, rank: int) -> int | None:
        """The `rank` a symptom carries: None for a single-process run (merges with check/ask)."""
        return rank if self.world_size > 1 else None

    def file(self, stem: str, suffix: str, rank: int = 0) -> Path:
        return self.run_dir / f"{stem}.rank{rank}{suffix}"

    # -- building results ------------------------------------------------------------

    def location(self, path: str, line: int | None, function: str | None = None) -> Location:
        code = linecache.getline(path, line).strip() if line else ""
        return Location(
            path=display_path(path, self.cwd),
            line=line,
            function=function,
            code=code or None,
        )

    def symptom(
        self,
        symptom_id: str,
        *,
        probe: str,
        summary: str,
        values: dict[str, Any] | None = None,
        location: Location | None = None,
        step: int | None = None,
        rank: int = 0,
        quote: str | None = None,
        confidence: float = 1.0,
        severity: str | None = None,
        evidence: list[Evidence] | None = None,
    ) -> Symptom:
        """A catalogue symptom with one piece of probe evidence (more via `evidence`)."""
        first = Evidence(
            kind="probe", summary=summary, quote=quote, values=dict(values or {}), source=probe, location=location
        )
        fields: dict[str, Any] = {
            "confidence": confidence,
            "evidence": [first, *(evidence or [])],
            "location": location,
            "step": step,
            "rank": self.rank_of(rank),
        }
        if severity:
            fields["severity"] = severity
        return catalog.make_symptom(symptom_id, **fields)

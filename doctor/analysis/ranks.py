"""How each rank of a distributed run ended, which failed first, and how the job ended.

Pure Python, no torch. Each rank's stream holds the bootstrap's `exit` event
(how the script ended: completed, steps, exit, exception, interrupted,
terminated) and, under torchrun, the `process-exit` event its waiter wrote
(the process's exit code or fatal signal; probes/bootstrap.py). Together:

- finished            the script ended normally (exit code 0)
- finished-then-died  …and then the process died of a signal or a non-zero
                      status in interpreter shutdown (`after_last_step`); the
                      torch 2.13 CPU build aborts so at exit in about one DDP
                      run in four ("terminate called without an active
                      exception")
- exception           an uncaught exception
- exit-nonzero        sys.exit(n), n != 0
- crash               a fatal signal (SIGSEGV, SIGABRT, …) during training
- killed              SIGKILL during training (the OOM killer, or a teardown)
- terminated          SIGTERM/SIGINT/SIGHUP: stopped by torchrun's agent or torchdoctor
- interrupted         KeyboardInterrupt
- unknown             nothing recorded (the rank and its waiter were killed together)

The first failure (by wall-clock time) among exception, exit-nonzero, crash
and killed is what the job died of; ranks that failed later — a gloo
"Connection closed by peer", torchrun's SIGTERM — are its consequences.
On one node of a multi-node job the evidence holds only this node's ranks
(`remote_ranks` are the others): a local rank whose error says it lost its
connection to a peer (`lost_peer`) did not fail first, a rank elsewhere did,
and that node's own report names it.

Where a live rank waits (`where_ranks_wait`) comes from its faulthandler
stack: the outermost public function of torch.distributed's c10d module
below the user's frame (all_reduce, barrier, broadcast, all_gather_object,
init_process_group, …), DDP's own forward or construction, a backward of a
DDP model (the reducer's gradient all-reduce runs inside it), or, outside
any collective, the outermost library call of the user's line (`get
(queues.py)`) or the user's line itself (`time.sleep(3600)`).
"""

from __future__ import annotations

import json
import linecache
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchdoctor.analysis.evidence import Outcome, RunEvidence
from torchdoctor.analysis.outcome import FATAL
from torchdoctor.analysis.outcome import decide as decide_single
from torchdoctor.analysis.stacks import Thread, parse
from torchdoctor.clip import clip
from torchdoctor.probes.userframes import is_user_file

FAILURES = ("exception", "exit-nonzero", "crash", "killed")
STOPPING = ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT")  # signals that stop a process from outside
# A collective's error when its partner process went away (gloo, NCCL, the c10d store's socket).
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|remote process exit|ncclRemoteError|"
                       r"Broken pipe|remote worker crash", re.IGNORECASE)


@dataclass
class RankEnd:
    rank: int
    kind: str  # see the module docstring
    steps: int = 0
    reason: str | None = None  # the bootstrap's exit reason
    code: int | None = None  # the exit code: the script's, or the process's
    status: int | None = None  # the process's exit status as its waiter saw it (-6: SIGABRT)
    signal: str | None = None  # the fatal signal the process died of
    ended_at: float | None = None  # wall-clock time of the end (of the exception, for one)
    error: str | None = None  # "Type: message" of its exception
    exception: dict[str, Any] | None = None
    host: str | None = None
    world_size: int | None = None  # from its start event

    @property
    def lost_peer(self) -> bool:
        """It raised because a partner process went away (not a failure of its own)."""
        message = (self.exception or {}).get("message") or self.error or ""
        return self.kind == "exception" and bool(PEER_LOST.search(message))

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES

    @property
    def after_last_step(self) -> bool:
        return self.kind == "finished-then-died"

    def describe(self) -> str:
        """'exited with code 1 after `ValueError: …`', 'died of SIGSEGV', …"""
        if self.kind == "exception":
            return f"raised `{clip(self.error or 'an exception', 200)}`"
        if self.kind == "exit-nonzero":
            return f"exited with code {self.code}"
        if self.kind in ("crash", "killed", "finished-then-died"):
            what = f"died of {self.signal}" if self.signal else f"exited with status {self.status}"
            return what + (" in interpreter shutdown" if self.after_last_step else "")
        if self.kind == "terminated":
            return "was stopped (" + (self.signal or "SIGTERM") + ")"
        if self.kind == "interrupted":
            return "was interrupted"
        if self.kind == "finished":
            return "finished"
        return "ended without a trace"


def wall_time(start: dict[str, Any] | None, event: dict[str, Any]) -> float | None:
    """An event's wall-clock time: the start event's `time` plus the stream's clock since."""
    if "time" in event and event.get("kind") != "start":
        return float(event["time"])
    if not start or "time" not in start:
        return None
    return float(start["time"]) + float(event.get("t", 0.0)) - float(start.get("t", 0.0))


def rank_end(rank: int, events: list[dict[str, Any]]) -> RankEnd:
    start = next((e for e in events if e.get("kind") == "start"), None)
    exits = [e for e in events if e.get("kind") == "exit"]
    process = next((e for e in reversed(events) if e.get("kind") == "process-exit"), None)
    exceptions = [e for e in events if e.get("kind") == "exception"]
    steps = [e for e in events if e.get("kind") == "step"]
    end = RankEnd(rank=rank, kind="unknown", steps=int(steps[-1]["step"]) if steps else 0,
                  host=start.get("host") if start else None,
                  world_size=int(start["world_size"]) if start and start.get("world_size") else None)
    exit_event = exits[-1] if exits else None
    if exit_event is not None:
        end.reason = exit_event.get("reason")
        end.code = exit_event.get("code")
        end.ended_at = wall_time(start, exit_event)
    proc_code = process.get("code") if process else None
    proc_signal = process.get("signal") if process else None
    end.status = proc_code
    if exceptions:
        end.exception = exceptions[-1]
        end.error = f"{end.exception.get('type', 'Exception')}: {_first_line(end.exception.get('message', ''))}"

    reason = end.reason
    if reason in ("completed", "steps") or (reason == "exit" and end.code == 0):
        # SIGTERM & co. in shutdown: torchrun stopping it because another rank died; its work was done
        died = proc_signal not in (None, *STOPPING) or (proc_signal is None and proc_code not in (None, 0))
        end.kind = "finished-then-died" if died else "finished"
        end.signal = proc_signal
        if died and process is not None:
            end.ended_at = process.get("time", end.ended_at)
    elif reason == "exit":
        end.kind = "exit-nonzero"
    elif reason == "exception":
        end.kind = "exception"
        end.ended_at = wall_time(start, end.exception) if end.exception else end.ended_at
    elif reason == "interrupted":
        end.kind = "interrupted"
    elif reason == "terminated":
        end.kind, end.signal = "terminated", proc_signal or "SIGTERM"
    elif process is not None:  # no exit event: the process ended below Python
        end.ended_at = process.get("time")
        end.signal = proc_signal
        end.code = proc_code
        if proc_signal in FATAL:
            end.kind = "crash"
        elif proc_signal == "SIGKILL":
            end.kind = "killed"
        elif proc_signal is not None:
            end.kind = "terminated"
        else:
            end.kind = "finished" if proc_code == 0 else "exit-nonzero"
    return end


def rank_ends(run: RunEvidence) -> dict[int, RankEnd]:
    return {rank: rank_end(rank, run.events.get(rank, [])) for rank in run.ranks if run.events.get(rank)}


def remote_ranks(ends: dict[int, RankEnd]) -> list[int]:
    """The job's ranks whose evidence is not here: they run on other nodes."""
    world = max((e.world_size or 0 for e in ends.values()), default=0)
    return [r for r in range(world) if r not in ends]


def lost_to_remote(end: RankEnd, remote: list[int]) -> str:
    """'Rank 0 lost its connection to another rank after 3 optimizer steps (`…`); rank 1 runs on another
    node, where the failure began: that node's report names it'."""
    steps = f"{end.steps} optimizer step{'' if end.steps == 1 else 's'}"
    where = (f"rank {remote[0]} runs on another node" if len(remote) == 1
             else f"ranks {_listing(remote)} run on other nodes")
    return (f"Rank {end.rank} lost its connection to another rank after {steps} (it raised "
            f"`{clip(end.error or 'an exception', 200)}`): {where}, where the failure began; that node's report "
            "names the rank that failed first and its line")


def first_failure(ends: dict[int, RankEnd]) -> RankEnd | None:
    """The rank the job died of: the earliest failure that is not a consequence of an abort at exit."""
    spared = aftermath(ends)
    failed = [e for e in ends.values() if e.failed and e.rank not in spared]
    if not failed:
        return None
    return min(failed, key=lambda e: (e.ended_at if e.ended_at is not None else math.inf, e.rank))


def aftermath(ends: dict[int, RankEnd]) -> set[int]:
    """Ranks that had done all their steps and were stopped (by torchrun) after another rank aborted at exit.

    torchrun's agent treats a rank that dies after its script finished like any failed
    worker and stops the others; one still in its own shutdown then ends by SIGTERM
    (or is killed), although its work was done.
    """
    died = [e for e in ends.values() if e.after_last_step]
    if not died:
        return set()
    steps = max(e.steps for e in died)
    since = min((e.ended_at for e in died if e.ended_at is not None), default=None)
    return {
        e.rank for e in ends.values()
        if e.kind in ("terminated", "killed", "unknown") and e.steps >= steps
        and (since is None or e.ended_at is None or e.ended_at >= since)
    }


def tail_events(path: Path, size: int = 65536) -> list[dict[str, Any]]:
    """The last events of a stream (the end of a rank is written last)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            length = fh.tell()
            fh.seek(max(0, length - size))
            data = fh.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if length > size:
        lines = lines[1:]  # the first line is cut
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def failed_during_training(run_dir: Path, rank: int) -> bool | None:
    """For the supervisor, once a rank's process is gone: did it fail? None: not written yet."""
    events = tail_events(Path(run_dir) / f"events.rank{rank}.jsonl")
    process = any(e.get("kind") == "process-exit" for e in events)
    exit_event = next((e for e in reversed(events) if e.get("kind") == "exit"), None)
    if exit_event is not None and exit_event.get("reason") == "exception":
        return True
    if not process:
        return None
    return rank_end(rank, events).failed


def decide(
    returncode: int | None,
    decided: str | None,
    ends: dict[int, RankEnd],
    duration_s: float,
    sent_signal: str | None,
) -> Outcome:
    """How a distributed job ended, from every rank's end (torchrun's own exit code says little)."""
    duration = round(duration_s, 3)
    if decided in ("hang", "timeout", "interrupted") or not ends:
        outcome = decide_single(returncode, decided, None, duration_s, sent_signal)
        if not ends and decided is None:
            outcome.notes.append("No rank of the torchrun job started the script (see torchrun's output above).")
        return outcome
    first = first_failure(ends)
    if first is not None:
        steps = f"{first.steps} optimizer step{'' if first.steps == 1 else 's'}"
        notes = [f"Rank {first.rank} failed first: it {first.describe()}"
                 + (f" after {steps}." if first.steps else " before its first optimizer step.")]
        remote = remote_ranks(ends)
        if remote and first.lost_peer:
            notes = [lost_to_remote(first, remote) + "."]
        if first.kind == "exception":
            return Outcome("crashed", first.code if first.code is not None else 1, None, duration, notes=notes)
        if first.kind == "exit-nonzero":
            return Outcome("exited", first.code, None, duration, notes=notes)
        stopped = "crashed" if first.signal in FATAL else "killed"
        return Outcome(stopped, None, first.signal, duration, notes=notes)
    spared = aftermath(ends)
    finished = [e for e in ends.values() if e.kind in ("finished", "finished-then-died") or e.rank in spared]
    if len(finished) == len(ends):
        stopped = "steps" if any(e.reason == "steps" for e in finished) else "completed"
        died = [e for e in finished if e.after_last_step]
        notes = []
        if died:
            who = f"Rank {died[0].rank}" if len(died) == 1 else "Ranks " + _listing([e.rank for e in died])
            notes.append(
                f"{who} {died[0].describe()} (after the last optimizer step and the script's own last output): "
                "training completed; the failure is in interpreter shutdown, not in training. The torch 2.13 CPU "
                "build aborts like this at exit in about one DDP run in four (\"terminate called without an "
                "active exception\")."
            )
        elif returncode not in (0, None):
            notes.append(f"torchrun exited with {returncode} although every rank finished its script.")
        return Outcome(stopped, 0, died[0].signal if died else None, duration, notes=notes)
    if any(e.kind == "interrupted" for e in ends.values()):
        return Outcome("interrupted", 130, None, duration)
    return Outcome("killed", None, sent_signal or "SIGTERM", duration,
                   notes=["The ranks were stopped from outside (torchrun's agent or a signal) without a rank failing."])


def _listing(items: list[Any]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


# -- where a live rank waits (from its faulthandler stack) ------------------------------

_C10D = "/torch/distributed/distributed_c10d.py"
_DDP = "/torch/nn/parallel/distributed.py"
_BACKWARD = ("/torch/autograd/graph.py", "/torch/autograd/__init__.py", "/torch/_tensor.py")
_WAIT_CALL = re.compile(r"\.wait\(\s*\)")


@dataclass
class Blocked:
    """Where one rank's main thread was when its stack was taken."""

    rank: int
    collective: str | None  # "all_reduce", "barrier", "DDP gradient all-reduce (in backward)", …
    stuck_in: str | None  # outside any collective: the call it was in
    frame: tuple[str, int, str] | None  # the user's frame (path, line, function)
    thread: Thread | None

    def site(self) -> tuple[str | None, int | None]:
        return (self.frame[0], self.frame[1]) if self.frame else (None, None)


def blocked_in(frames: list[tuple[str, int, str]], project: str | None, has_ddp: bool,
               code: str | None = None) -> tuple[str | None, str | None, tuple[str, int, str] | None]:
    """(collective, stuck_in, user frame) from a stack, innermost frame first."""
    user_at = next((i for i, f in enumerate(frames) if is_user_file(f[0], project)), None)
    if user_at is None:
        user_at = next((i for i, f in enumerate(frames) if is_user_file(f[0])), None)
    frame = frames[user_at] if user_at is not None else None
    library = frames[:user_at] if user_at is not None else frames
    posix = [(p.replace("\\", "/"), line, fn) for p, line, fn in library]
    c10d = [fn for p, _, fn in posix if p.endswith(_C10D) and not fn.startswith("_") and fn != "wrapper"]
    if c10d:
        return c10d[-1], None, frame  # the outermost: all_gather_object rather than the all_gather inside it
    ddp = [fn for p, _, fn in posix if p.endswith(_DDP)]
    if ddp:
        phase = "construction" if "__init__" in ddp else "forward"
        return f"DDP {phase} ({ddp[0]})", None, frame
    if any(p.endswith(_BACKWARD) for p, _, _ in posix):
        if has_ddp:
            return "DDP gradient all-reduce (in backward)", None, frame
        return None, "backward", frame
    other = [(p, fn) for p, _, fn in posix if "/torch/distributed/" in p]
    if other:
        return other[-1][1], None, frame
    if not library and code and _WAIT_CALL.search(code):
        return "Work.wait (an async collective)", None, frame
    if library:
        path, _, fn = library[-1]  # the outermost library call the user's line made
        return None, f"{fn} ({os.path.basename(path)})", frame
    return None, code or (frame[2] if frame else None), frame


def where_ranks_wait(run: RunEvidence, ranks: list[int], has_ddp: dict[int, bool]) -> dict[int, Blocked]:
    """Every rank's main-thread position from stacks.rank<R>.txt (ranks without a dump are left out)."""
    out: dict[int, Blocked] = {}
    for rank in ranks:
        try:
            text = run.file("stacks", ".txt", rank).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        dump = parse(text)
        if dump is None:
            continue
        start = run.start(rank) or {}
        thread = dump.main(start.get("main_thread"))
        if thread is None:
            continue
        frames = thread.frames
        user = next((f for f in frames if is_user_file(f[0], run.project)), None)
        code = linecache.getline(user[0], user[1]).strip() if user else None
        collective, stuck_in, frame = blocked_in(frames, run.project, has_ddp.get(rank, False), code)
        out[rank] = Blocked(rank=rank, collective=collective, stuck_in=stuck_in, frame=frame, thread=thread)
    return out

"""Start the script's process and supervise it: timeout, hang watchdog, Ctrl-C, clean-up.

The child runs in its own session and process group (`start_new_session`),
so the terminal's Ctrl-C reaches only torchdoctor, which forwards it, and the
whole group — DataLoader workers included — can be stopped at once. It dies
with torchdoctor, even when torchdoctor is killed outright (PR_SET_PDEATHSIG,
set before the exec; the bootstrap chains it on to the script's forked
workers and, under torchrun, to every rank: lifetime.py):

- first Ctrl-C: SIGINT to the group (the script sees KeyboardInterrupt and the
  probes write their last evidence); a script still running `interrupt_grace_s`
  later (it ignores or swallows SIGINT; not one whose probes are still doing
  their end-of-run work) is stopped as on a timeout: SIGTERM,
  then SIGKILL after the grace period; second Ctrl-C: SIGKILL to the group.
  Once interrupted, the run is `interrupted`, never a hang or a timeout.
  SIGTERM or SIGHUP to torchdoctor: SIGTERM to the group, then SIGKILL after
  the grace period;
- --timeout, and the watchdog (no progress for --hang-timeout seconds: no
  optimizer step, no forward of a tracked model, no backward — the ranks'
  heartbeat counters, probes/heartbeat.py — and no output from the main
  thread of the script's main process (its bytes written,
  /proc/<pid>/task/<pid>/io: a logger thread printing on while the main
  thread is stuck is no progress);
  before the first step, counted from the start, at least the start-up
  allowance `[run] startup_timeout_s`, since imports, data preparation and a
  first compiled step are slow but not hung; and not while the script has
  ended and the probes do their end-of-run work — gradcheck, a final
  census —, from each rank's `finishing` event to its `exit` event, when
  only --timeout bounds the run): SIGUSR1 to each rank's main
  process, whose faulthandler writes every thread's stack to
  stacks.rank<R>.txt, then SIGTERM to each rank's main process (the probes
  write their last evidence), SIGKILL to the group after the grace period;
- after the child has exited, whatever is left of the run gets SIGTERM, then
  SIGKILL: no process outlives the run. "Left" is more than the group: on
  Linux torchdoctor is a child subreaper (lifetime.py) for the run, so a
  process the script detached (`start_new_session=True`, a daemon's double
  fork) re-parents to torchdoctor, not to init, and is found among its
  descendants. Orphans that exit during the run are reaped as they go (never
  the script's own process: Popen and the pidfd wait keep its status). What
  had to be ended, and what could not be, is named in the report.

A distributed run (`distributed=True`) starts torchrun's agent as the child.
The agent starts every rank in a session of its own, so the supervisor also
tracks the ranks' process groups (from the ranks' start events, checked to
descend from the agent, and from a scan of the agent's descendants) and
handles them as it handles the child's group:

- stacks and SIGTERM go to each rank's main process, never to the agent;
  ranks still alive after `rank_grace_s` are killed (a rank blocked inside
  a C++ collective cannot run Python's SIGTERM handler), then the agent;
- a rank that failed (an exception, a non-zero exit, a fatal signal) while
  others keep running without a step for `peer_wait_s`: the others wait for
  a partner that is gone. Their stacks are taken and the job is stopped, so
  nobody waits for torchrun's 30 s shutdown or a collective's timeout;
- a second Ctrl-C kills every group of the job.

No torch here; the parent never imports it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from torchdoctor import lifetime
from torchdoctor.analysis.evidence import EventTail, heartbeat_files

POLL_S = 0.25
SCAN_EVERY_S = 1.0  # how often a distributed run's process tree is scanned for new process groups


def open_pidfd(pid: int) -> int | None:
    """A file descriptor that turns readable when the process exits (Linux ≥ 5.3), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def wait_exit(proc: subprocess.Popen, pidfd: int | None, timeout: float) -> bool:
    """Whether the child exited within `timeout` seconds.

    `Popen.wait(timeout)` polls with sleeps of at most 50 ms: ~40 wake-ups a second, each one a context
    switch on the script's core when both share it (a 2-CPU CI runner). A pidfd wakes us once.
    """
    if pidfd is not None:
        ready, _, _ = select.select([pidfd], [], [], timeout)
        if not ready:
            return False
        if proc.poll() is not None:
            return True
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


@dataclass
class ChildResult:
    returncode: int | None
    decided: str | None  # hang | timeout | interrupted: torchdoctor ended it, and why
    duration_s: float
    seconds_without_step: float | None = None
    sent_signal: str | None = None  # the last signal torchdoctor sent to end it
    pids: dict[int, int] = field(default_factory=dict)
    decided_at: float | None = None  # wall-clock time of torchdoctor's decision (hang, timeout, a dead peer)
    peer_failed: int | None = None  # the failed rank whose waiting peers torchdoctor stopped
    leftovers: list[dict] = field(default_factory=list)  # processes of the run alive after the script: pid,
    # command, ended_by (SIGTERM | SIGKILL | None: could not be ended)
    hang_limit_s: float | None = None  # the hang watchdog's limit when the run ended (None: no watchdog)


class Supervisor:
    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        run_dir: Path,
        stdout: int | IO | None,
        timeout_s: float | None,
        hang_timeout_s: float | None,
        startup_s: float = 60.0,
        grace_s: float = 5.0,
        hang_gap_factor: float = 0.0,
        stacks_wait_s: float = 2.0,
        *,
        distributed: bool = False,
        rank_grace_s: float = 1.0,
        peer_wait_s: float = 3.0,
        node_settle_s: float = 0.0,
        interrupt_grace_s: float = 3.0,
        settle_s: float = 1.0,
    ):
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.run_dir = run_dir
        self.stdout = stdout
        self.timeout_s = timeout_s
        self.hang_timeout_s = hang_timeout_s
        self.startup_s = startup_s
        self.grace_s = grace_s
        # 0: --hang-timeout is the limit as given. Otherwise (the default timeout) the limit grows to this many
        # times the longest quiet spell between two signs of activity after the first step: a model whose
        # forward alone takes a minute on a loaded CPU is slow, not hung, and has already shown it.
        self.hang_gap_factor = hang_gap_factor
        self.longest_gap_s = 0.0
        self._stepped = False
        self.stacks_wait_s = stacks_wait_s
        self.tail = EventTail(run_dir)
        self.proc: subprocess.Popen | None = None
        self.decided: str | None = None
        self.sent: str | None = None
        self.interrupts = 0
        self.interrupt_grace_s = interrupt_grace_s
        self.interrupted_at: float | None = None  # monotonic time of the first Ctrl-C, until it is enforced
        self.stop_requested: int | None = None  # a signal torchdoctor itself received
        self.distributed = distributed
        self.rank_grace_s = rank_grace_s
        self.peer_wait_s = peer_wait_s
        self.node_settle_s = node_settle_s  # a multi-node job: other nodes' watchdogs take their stacks first
        self.ranks: dict[int, int] = {}  # rank -> pid of its main process, on this host, in this job
        self.groups: set[int] = set()  # the ranks' process groups (distributed runs)
        self.decided_at: float | None = None
        self.peer_failed: int | None = None
        self._failed_seen: tuple[int, float] | None = None  # (rank, monotonic time) of a failed rank
        self._verdicts: dict[int, bool] = {}  # rank -> did its process fail (once it is gone)
        self._last_scan = 0.0
        self.settle_s = settle_s  # leftovers get this long to exit on their own before they are ended
        self._subreaper = False
        self._before: set[int] = set()  # torchdoctor's own children from before the run (an in-process caller's)
        self.leftovers: list[dict] = []
        self.guard: subprocess.Popen | None = None  # run_guard.py: ends the run if torchdoctor is killed
        self._told: set[int] = set()  # the process groups the guard knows

    # -- signals to torchdoctor ------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self.interrupts += 1
        self.decided = self.decided or "interrupted"
        if self.interrupts > 1:
            self._signal_group(signal.SIGKILL)
            self._kill_groups()
        elif signum == signal.SIGINT:
            self._signal_group(signal.SIGINT)
            self.interrupted_at = time.monotonic()
        else:
            self.stop_requested = signum  # the loop terminates with a grace period

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        self.sent = signal.Signals(sig).name
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    # -- the run ------------------------------------------------------------------------

    def run(self) -> ChildResult:
        watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.getsignal(s) for s in watched}
        for s in watched:
            signal.signal(s, self._on_signal)
        started = time.monotonic()
        waited: float | None = None
        pidfd: int | None = None
        was_subreaper = lifetime.subreaper()
        self._subreaper = was_subreaper or lifetime.become_subreaper()
        self._before = _children_now()
        self._start_guard()
        try:
            env = {**self.env, lifetime.SUPERVISOR_ENV: str(os.getpid())}
            self.proc = subprocess.Popen(
                self.argv, env=env, cwd=self.cwd, stdout=self.stdout, start_new_session=True,
                preexec_fn=_dies_with(os.getpid()),
            )
            self._tell_guard(self.proc.pid)
            last_progress = started
            pidfd = open_pidfd(self.proc.pid)
            while True:
                if wait_exit(self.proc, pidfd, POLL_S):
                    break
                self._reap_adopted()
                now = time.monotonic()
                if self.tail.poll():
                    if self._stepped:  # quiet spells before the first step are start-up (startup_s covers them)
                        self.longest_gap_s = max(self.longest_gap_s, now - last_progress)
                    self._stepped = self._stepped or any(self.tail.steps.values())
                    last_progress = now
                if self.distributed:
                    self._track_ranks(now)
                if self.stop_requested is not None:
                    self.stop_requested = None
                    self._terminate()
                elif self.interrupted_at is not None:
                    # The script did not stop on SIGINT. One that did and whose probes are writing their last
                    # evidence (slow on a loaded machine) is left to finish: a second Ctrl-C or --timeout ends it.
                    if now - self.interrupted_at >= self.interrupt_grace_s and not self.tail.only_finishing():
                        self.interrupted_at = None
                        self._terminate()
                elif self.timeout_s and now - started > self.timeout_s:
                    waited = now - last_progress
                    self._stop("timeout")
                elif self.hang_timeout_s and now - last_progress > self._hang_limit() and not self.tail.only_finishing():
                    waited = now - last_progress
                    self._stop("hang")
                elif self._peer_failed(now, last_progress):
                    self._stop(None)
        finally:
            duration = time.monotonic() - started
            if pidfd is not None:
                os.close(pidfd)
            if self.proc is not None:
                if self.proc.poll() is None:  # torchdoctor itself failed mid-run
                    self._terminate()
                self._clean_up()
            self._stop_guard()
            if self._subreaper and not was_subreaper:
                lifetime.become_subreaper(False)
            for s, handler in previous.items():
                signal.signal(s, handler)
        self.tail.poll()
        for path in heartbeat_files(self.run_dir).values():  # the watchdog's counters: not evidence
            try:
                path.unlink()
            except OSError:
                pass
        return ChildResult(
            returncode=self.proc.returncode if self.proc else None,
            decided=self.decided,
            duration_s=duration,
            seconds_without_step=waited,
            sent_signal=self.sent,
            pids=dict(self.ranks or self.tail.pids),
            decided_at=self.decided_at,
            peer_failed=self.peer_failed,
            leftovers=list(self.leftovers),
            hang_limit_s=self._hang_limit() if self.hang_timeout_s else None,
        )

    def _hang_limit(self) -> float:
        """--hang-timeout between steps, widened to the run's own slowest quiet spell when the timeout is
        the default; before the first step, at least the start-up allowance."""
        assert self.hang_timeout_s
        if any(self.tail.steps.values()):
            return max(self.hang_timeout_s, self.hang_gap_factor * self.longest_gap_s)
        return max(self.hang_timeout_s, self.startup_s)

    def _stop(self, reason: str | None) -> None:
        """End the run for `reason` (None: a failed rank's peers wait for it): stacks first, then terminate."""
        self.decided = reason or self.decided
        self.decided_at = time.time()
        self._dump_stacks()
        if reason == "hang" and self.node_settle_s > 0:
            time.sleep(self.node_settle_s)  # every node's watchdog fires at about this time: let them dump first
        self._terminate()

    def _targets(self) -> dict[int, int]:
        """rank -> the pid of each rank's main process: the processes to signal (never torchrun's agent)."""
        assert self.proc is not None
        if self.distributed:
            return {rank: pid for rank, pid in self.ranks.items() if _alive(pid)}
        return dict(self.tail.pids) or {0: self.proc.pid}

    def _dump_stacks(self) -> None:
        """SIGUSR1 to each rank's main process; wait until faulthandler has written."""
        targets = self._targets()
        for pid in targets.values():
            try:
                os.kill(pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass
        files = [self.run_dir / f"stacks.rank{rank}.txt" for rank in targets]
        if not files:
            return
        deadline = time.monotonic() + self.stacks_wait_s
        sizes: list[int] = []
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = [f.stat().st_size if f.exists() else 0 for f in files]
            if all(now) and now == sizes:
                break
            sizes = now

    def _terminate(self) -> None:
        """SIGTERM to each rank's main process, SIGKILL to the group after the grace period.

        The ranks first: a DataLoader whose workers die before it does raises a confusing
        "worker killed by signal" error; a main process that ends first shuts its workers down.
        """
        assert self.proc is not None
        if self.proc.poll() is not None:
            return
        self.sent = "SIGTERM"
        targets = self._targets()
        for pid in targets.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        if self.distributed:
            self._scan()
            if not targets:  # no rank has started yet: torchrun's agent stops its workers itself
                self._signal_group(signal.SIGTERM)
            self._end_ranks(targets)
        try:
            self.proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            try:
                self.proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                pass

    def _clean_up(self) -> None:
        """Nothing of the run outlives it: what is left gets SIGTERM, then SIGKILL, and is reaped.

        A leftover gets `settle_s` to exit on its own first (a DataLoader worker that noticed its
        parent's end, multiprocessing's resource tracker): only what is still there was left behind.
        """
        assert self.proc is not None
        if self.distributed:
            self._scan()
        left = self._leftovers()
        if not left:
            return
        left = self._wait_gone(left, self.settle_s)
        if not left:
            return
        records = {p.pid: {"pid": p.pid, "command": _command(p), "ended_by": "SIGTERM"} for p in left}
        for p in left:
            _send(p, signal.SIGTERM)
        left = self._wait_gone(left, self.grace_s, hurry=True)
        for p in left:
            records[p.pid]["ended_by"] = "SIGKILL"
            _send(p, signal.SIGKILL)
        left = self._wait_gone(left, 2.0)
        for p in left:
            records[p.pid]["ended_by"] = None
        self.leftovers = sorted(records.values(), key=lambda r: r["pid"])

    def _leftovers(self) -> list:
        """The run's processes still alive: torchdoctor's new descendants and the members of the run's groups."""
        import psutil

        assert self.proc is not None
        found: dict[int, psutil.Process] = {}
        try:
            me = psutil.Process()
            for child in me.children():
                if child.pid in self._before or child.pid in (self.proc.pid, self._guard_pid()):
                    continue
                found[child.pid] = child
                for below in child.children(recursive=True):
                    found[below.pid] = below
        except psutil.Error:
            pass
        groups = {self.proc.pid, *self.groups} - {os.getpgrp()}
        if any(_group_exists(g) for g in groups):  # without a subreaper, orphans of the groups went to init
            for proc in psutil.process_iter():
                try:
                    if proc.pid not in found and os.getpgid(proc.pid) in groups:
                        found[proc.pid] = proc
                except (OSError, psutil.Error):
                    continue
        return [p for p in found.values() if not self._gone(p)]

    def _gone(self, proc) -> bool:
        """Has it ended? A zombie has; one that is torchdoctor's own child is reaped here."""
        import psutil

        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False
        try:
            if proc.ppid() == os.getpid():
                os.waitpid(proc.pid, os.WNOHANG)
        except (OSError, psutil.Error):
            pass
        return True

    def _wait_gone(self, procs: list, seconds: float, hurry: bool = False) -> list:
        """Wait up to `seconds` for `procs` to end (reaping the ones re-parented here); the ones left.
        `hurry`: a second Ctrl-C cuts the wait short."""
        deadline = time.monotonic() + seconds
        while True:
            procs = [p for p in procs if not self._gone(p)]
            if not procs or time.monotonic() >= deadline or (hurry and self.interrupts > 1):
                return procs
            time.sleep(0.05)

    # -- the guard (run_guard.py) -----------------------------------------------------

    def _start_guard(self) -> None:
        """Start the guard; without one (it failed to start) the death signals alone tie the run to us."""
        try:
            self.guard = subprocess.Popen(
                [sys.executable, "-m", "torchdoctor.run_guard", str(os.getpid())], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
        except OSError:
            self.guard = None

    def _guard_pid(self) -> int:
        return self.guard.pid if self.guard is not None else 0

    def _tell_guard(self, pgid: int) -> None:
        if self.guard is None or pgid in self._told or self.guard.stdin is None:
            return
        self._told.add(pgid)
        try:
            self.guard.stdin.write(f"group {pgid}\n".encode())
            self.guard.stdin.flush()
        except OSError:  # the guard is gone (killed): the death signals remain
            pass

    def _stop_guard(self) -> None:
        """The run is over and cleaned up: the guard exits without ending anything."""
        if self.guard is None:
            return
        try:
            assert self.guard.stdin is not None
            self.guard.stdin.write(b"done\n")
            self.guard.stdin.close()
        except OSError:
            pass
        try:
            self.guard.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.guard.kill()
            self.guard.wait()

    def _reap_adopted(self) -> None:
        """Reap orphans that re-parented here and exited, so none stays a zombie while the run goes on.

        waitid(WNOWAIT) peeks at an exited child without reaping it: the script's own process is left
        to Popen (its exit status is the run's), and so is any child an in-process caller had before.
        A guard that died is reaped here too (its Popen then reads status 0: nothing waits on it).
        """
        if not self._subreaper or not hasattr(os, "waitid"):
            return
        assert self.proc is not None
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except (ChildProcessError, OSError):
                return
            if info is None or info.si_pid in (0, self.proc.pid) or info.si_pid in self._before:
                return
            try:
                os.waitpid(info.si_pid, 0)
            except ChildProcessError:
                return

    # -- distributed runs --------------------------------------------------------------

    def _track_ranks(self, now: float) -> None:
        """Learn the ranks' main processes and process groups as they start."""
        assert self.proc is not None
        new = {r: p for r, p in self.tail.pids.items() if self.ranks.get(r) != p}
        if new or now - self._last_scan >= SCAN_EVERY_S:
            family = self._scan()
            for rank, pid in new.items():
                if pid in family:  # a start event of this job on this host (a shared --out holds other nodes')
                    self.ranks[rank] = pid

    def _scan(self) -> set[int]:
        """The agent's descendants now; their process groups join the ones to clean up."""
        import psutil

        assert self.proc is not None
        self._last_scan = time.monotonic()
        try:
            family = {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.Error:
            return set()
        for pid in family:
            try:
                self.groups.add(os.getpgid(pid))
            except OSError:
                continue
        self.groups.discard(os.getpgrp())  # never torchdoctor's own group
        for pgid in self.groups:
            self._tell_guard(pgid)
        return family

    def _peer_failed(self, now: float, last_progress: float) -> bool:
        """A rank failed and the others have made no step for peer_wait_s since: they wait for it."""
        if not self.distributed or not self.ranks or self.peer_wait_s <= 0:
            return False
        if self._failed_seen is None:
            rank = self._failed_rank()
            if rank is None:
                return False
            self._failed_seen = (rank, now)
        rank, since = self._failed_seen
        if now - max(since, last_progress) < self.peer_wait_s or not self._targets():
            return False
        self.peer_failed = rank
        return True

    def _failed_rank(self) -> int | None:
        """A rank whose process is gone after a failure while other ranks still run."""
        from torchdoctor.analysis.ranks import failed_during_training

        gone = [r for r, pid in self.ranks.items() if not _alive(pid)]
        if not gone or len(gone) == len(self.ranks):
            return None
        for rank in gone:
            if rank not in self._verdicts:
                verdict = failed_during_training(self.run_dir, rank)
                if verdict is None:  # its waiter has not written the process's end yet
                    continue
                self._verdicts[rank] = verdict
            if self._verdicts[rank]:
                return rank
        return None

    def _end_ranks(self, targets: dict[int, int]) -> None:
        """After SIGTERM: ranks get rank_grace_s to write their last evidence, then SIGKILL to their groups."""
        deadline = time.monotonic() + self.rank_grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in targets.values()):
            time.sleep(0.05)
        if any(_alive(pid) for pid in targets.values()):
            self.sent = "SIGKILL"
            self._kill_groups()

    def _kill_groups(self) -> None:
        for pgid in sorted(self.groups):
            _killpg(pgid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Is the process there and not a zombie?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _dies_with(supervisor: int):
    """The child's preexec: SIGKILL when torchdoctor dies, even of SIGKILL (a CI timeout, the OOM killer).

    PR_SET_PDEATHSIG fires when the parent *thread* exits: the supervisor runs on the main thread
    (it installs signal handlers, which only the main thread may), which lives as long as torchdoctor.
    The check against the parent's pid closes the race of a torchdoctor killed before the call.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    if not lifetime.available():  # looked up here, not in the forked child
        return None

    def preexec() -> None:
        lifetime.die_with_parent(supervisor)

    return preexec


def _children_now() -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process().children()}
    except psutil.Error:
        return set()


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _command(proc) -> str:
    import psutil

    try:
        return " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "?"


def _send(proc, sig: int) -> None:
    try:
        os.kill(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass

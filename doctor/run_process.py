"""Start the script's process and supervise it: timeout, hang watchdog, Ctrl-C, clean-up.

The child runs in its own session and process group (`start_new_session`),
so the terminal's Ctrl-C reaches only torchdoctor, which forwards it, and the
whole group — DataLoader workers included — can be stopped at once:

- first Ctrl-C: SIGINT to the group (the script sees KeyboardInterrupt and the
  probes write their last evidence); second Ctrl-C: SIGKILL to the group.
  SIGTERM or SIGHUP to torchdoctor: SIGTERM to the group, then SIGKILL after
  the grace period;
- --timeout, and the watchdog (no new step event for --hang-timeout seconds;
  before the first step, counted from the start, at least the start-up
  allowance `[run] startup_timeout_s`, since imports, data preparation and a
  first compiled step are slow but not hung): SIGUSR1 to each rank's main
  process, whose faulthandler writes every thread's stack to
  stacks.rank<R>.txt, then SIGTERM to each rank's main process (the probes
  write their last evidence), SIGKILL to the group after the grace period;
- after the child has exited, whatever is left in its group (orphaned
  workers) gets SIGTERM, then SIGKILL: no process outlives the run.

No torch here; the parent never imports it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from torchdoctor.analysis.evidence import EventTail

POLL_S = 0.25


@dataclass
class ChildResult:
    returncode: int | None
    decided: str | None  # hang | timeout | interrupted: torchdoctor ended it, and why
    duration_s: float
    seconds_without_step: float | None = None
    sent_signal: str | None = None  # the last signal torchdoctor sent to end it
    pids: dict[int, int] = field(default_factory=dict)


def group_alive(pgid: int) -> bool:
    """Is any non-zombie process left in the group?"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    import psutil

    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


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
        stacks_wait_s: float = 2.0,
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
        self.stacks_wait_s = stacks_wait_s
        self.tail = EventTail(run_dir)
        self.proc: subprocess.Popen | None = None
        self.decided: str | None = None
        self.sent: str | None = None
        self.interrupts = 0
        self.stop_requested: int | None = None  # a signal torchdoctor itself received

    # -- signals to torchdoctor ------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self.interrupts += 1
        self.decided = self.decided or "interrupted"
        if self.interrupts > 1:
            self._signal_group(signal.SIGKILL)
        elif signum == signal.SIGINT:
            self._signal_group(signal.SIGINT)
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
        try:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdout=self.stdout, start_new_session=True
            )
            last_progress = started
            while True:
                try:
                    self.proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if self.tail.poll():
                    last_progress = now
                if self.stop_requested is not None:
                    self.stop_requested = None
                    self._terminate()
                elif self.timeout_s and now - started > self.timeout_s:
                    waited = now - last_progress
                    self._stop("timeout")
                elif self.hang_timeout_s and now - last_progress > self._hang_limit():
                    waited = now - last_progress
                    self._stop("hang")
        finally:
            duration = time.monotonic() - started
            if self.proc is not None:
                if self.proc.poll() is None:  # torchdoctor itself failed mid-run
                    self._terminate()
                self._clean_group()
            for s, handler in previous.items():
                signal.signal(s, handler)
        self.tail.poll()
        return ChildResult(
            returncode=self.proc.returncode if self.proc else None,
            decided=self.decided,
            duration_s=duration,
            seconds_without_step=waited,
            sent_signal=self.sent,
            pids=dict(self.tail.pids),
        )

    def _hang_limit(self) -> float:
        """--hang-timeout between steps; before the first, at least the start-up allowance."""
        assert self.hang_timeout_s
        if any(self.tail.steps.values()):
            return self.hang_timeout_s
        return max(self.hang_timeout_s, self.startup_s)

    def _stop(self, reason: str) -> None:
        self.decided = reason
        self._dump_stacks()
        self._terminate()

    def _dump_stacks(self) -> None:
        """SIGUSR1 to each rank's main process; wait until faulthandler has written."""
        assert self.proc is not None
        pids = list(self.tail.pids.values()) or [self.proc.pid]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass
        files = [self.run_dir / f"stacks.rank{rank}.txt" for rank in (self.tail.pids or {0: 0})]
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
        for pid in list(self.tail.pids.values()) or [self.proc.pid]:
            try:
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            try:
                self.proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                pass

    def _clean_group(self) -> None:
        """Nothing of the run outlives it: leftovers in the group get SIGTERM, then SIGKILL."""
        assert self.proc is not None
        pgid = self.proc.pid
        if not group_alive(pgid):
            return
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.05)
        if group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and group_alive(pgid):
                time.sleep(0.05)

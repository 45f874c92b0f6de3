"""No process of a `torchdoctor run` outlives it, and none dies before its time.

Real scripts, real subprocesses, real signals: a script that detaches children
(`start_new_session=True`), torchdoctor itself killed with SIGKILL, Ctrl-C
on a script that ignores SIGINT.
"""

from __future__ import annotations

import psutil
import pytest

from tests.test_run_support import assert_sound, run_once
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    """Is the process there and not a zombie?"""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_detached_children_are_ended_and_named(tmp_path, validate_report):
    pidfile = tmp_path / "pids.txt"
    result = run_once(tmp_path / "run", "detaches.py", "--", str(pidfile))
    plain, stubborn = (int(p) for p in pidfile.read_text().split())
    assert not alive(plain) and not alive(stubborn), "a detached child outlived the run"
    assert_sound(result, validate_report, exitcodes.OK)
    assert result.run["stopped"] == "completed" and result.run["exit_code"] == 0
    left = {row["pid"]: row for row in result.run["leftover_processes"]}
    assert left[plain]["ended_by"] == "SIGTERM" and left[stubborn]["ended_by"] == "SIGKILL"
    assert "stubborn" in left[stubborn]["command"]
    note = next(n for n in result.report["notes"] if "outlived it" in n)
    assert f"pid {plain}" in note and f"pid {stubborn}" in note


def test_an_orphan_that_exits_during_the_run_is_reaped(tmp_path, validate_report):
    """torchdoctor adopts the orphans (subreaper) and so must reap them: no zombie while the run goes on."""
    seen = tmp_path / "seen.txt"
    result = run_once(tmp_path / "run", "double_fork.py", "--", str(seen))
    assert_sound(result, validate_report, exitcodes.OK)
    pid, state = seen.read_text().split(" ", 1)
    assert state == "gone", f"the orphan {pid} was not reaped during the run: {state}"
    assert result.run["leftover_processes"] == []  # it had ended on its own: nothing to end, nothing to name

"""No process of a `torchdoctor run` outlives it, and none dies before its time.

Real scripts, real subprocesses, real signals: a script that detaches children
(`start_new_session=True`), torchdoctor itself killed with SIGKILL, Ctrl-C
on a script that ignores SIGINT.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.test_run_support import RUN_FIXTURES, assert_sound, processes_of, run_once
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    """Is the process there and not a zombie?"""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.heavy  # waits for children to be ended
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


@pytest.mark.heavy  # waits for an orphan to exit
def test_an_orphan_that_exits_during_the_run_is_reaped(tmp_path, validate_report):
    """torchdoctor adopts the orphans (subreaper) and so must reap them: no zombie while the run goes on."""
    seen = tmp_path / "seen.txt"
    result = run_once(tmp_path / "run", "double_fork.py", "--", str(seen))
    assert_sound(result, validate_report, exitcodes.OK)
    pid, state = seen.read_text().split(" ", 1)
    assert state == "gone", f"the orphan {pid} was not reaped during the run: {state}"
    assert result.run["leftover_processes"] == []  # it had ended on its own: nothing to end, nothing to name


def _start_torchdoctor(*args: str, cwd=RUN_FIXTURES) -> subprocess.Popen:
    """`torchdoctor run ARGS` in a session of its own (as a CI runner starts it)."""
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.Popen([sys.executable, "-m", "torchdoctor.cli", "run", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def _wait_for(path, proc: subprocess.Popen, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _gone_within(pids, seconds: float) -> list[int]:
    """The pids still alive (not zombies) after waiting up to `seconds` for them to end."""
    deadline = time.monotonic() + seconds
    while True:
        left = [pid for pid in pids if alive(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def _end(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_script_and_its_workers_die_with_a_killed_torchdoctor(tmp_path):
    """SIGKILL to torchdoctor (a CI timeout, the OOM killer): nothing of the run keeps training —
    not the script, nor its workers however started (fork, spawn, a subprocess in its own session)."""
    pidfile = tmp_path / "pids.txt"
    run_dir = tmp_path / "run"
    doctor = _start_torchdoctor("workers_forever.py", "--out", str(run_dir), "--", str(pidfile))
    family: list[int] = []
    try:
        _wait_for(pidfile, doctor)
        started = {int(p) for p in pidfile.read_text().split()}
        family = [p.pid for p in psutil.Process(doctor.pid).children(recursive=True)]
        assert len(started) == 4 and started <= set(family)
        os.kill(doctor.pid, signal.SIGKILL)
        doctor.wait(timeout=10)
        assert _gone_within(family, 10) == [], "the run outlived a killed torchdoctor"
        assert processes_of(run_dir) == []
    finally:
        _end([doctor.pid, *family])
        doctor.stderr.close()


@pytest.mark.distributed
def test_a_torchrun_job_dies_with_a_killed_torchdoctor(tmp_path):
    """torchrun's agent is torchdoctor's child, the ranks the agent's (each in a session of its own)."""
    pidfile = tmp_path / "pids"
    doctor = _start_torchdoctor("--nproc-per-node", "2", "ranks_forever.py", "--out", str(tmp_path / "run"),
                                "--", str(pidfile))
    family: list[int] = []
    try:
        for rank in (0, 1):
            _wait_for(tmp_path / f"pids.rank{rank}", doctor, 120)
        ranks = [int(pid) for rank in (0, 1) for pid in (tmp_path / f"pids.rank{rank}").read_text().split()]
        family = [p.pid for p in psutil.Process(doctor.pid).children(recursive=True)]
        assert set(ranks) <= set(family) and len(family) >= 7  # agent, 2 waiters, 2 ranks, 2 workers
        os.kill(doctor.pid, signal.SIGKILL)
        doctor.wait(timeout=10)
        assert _gone_within(family, 10) == [], "the job outlived a killed torchdoctor"
        assert processes_of(tmp_path / "run") == []
    finally:
        _end([doctor.pid, *family])
        doctor.stderr.close()


def _interrupt(tmp_path, *script_args: str, presses: int = 1) -> tuple[subprocess.Popen, float, dict]:
    """Run ignores_sigint.py, press Ctrl-C `presses` times (0.3 s apart) once it trains; (process,
    seconds from the last press to torchdoctor's exit, report)."""
    ready = tmp_path / "ready"
    run_dir = tmp_path / "run"
    doctor = _start_torchdoctor("ignores_sigint.py", "--out", str(run_dir), "-f", "json", "--",
                                str(ready), *script_args)
    try:
        _wait_for(ready, doctor)
        for press in range(presses):
            if press:
                time.sleep(0.3)
            os.kill(doctor.pid, signal.SIGINT)  # the terminal sends it to torchdoctor's foreground group
        pressed = time.monotonic()
        doctor.wait(timeout=40)
        took = time.monotonic() - pressed
        return doctor, took, json.loads((run_dir / "report.json").read_text())
    finally:
        if doctor.poll() is None:
            doctor.kill()
        doctor.wait()
        doctor.stderr.close()
        assert processes_of(run_dir) == []


@pytest.mark.parametrize("ignored", ["sigint", pytest.param("sigint-and-sigterm", marks=pytest.mark.heavy)])  # the escalation waits
def test_one_ctrl_c_stops_a_script_that_ignores_it(tmp_path, validate_report, ignored):
    """Forwarded as SIGINT; the script runs on; `interrupt_grace_s` (3 s) later SIGTERM, then SIGKILL."""
    doctor, took, report = _interrupt(tmp_path, *(["term"] if ignored == "sigint-and-sigterm" else []))
    validate_report(report)
    assert doctor.returncode == exitcodes.INTERRUPTED
    assert report["run"]["stopped"] == "interrupted" and not [s for s in report["symptoms"] if s["id"] == "hang"]
    grace, term_grace = 3.0, 5.0
    if ignored == "sigint":
        assert report["run"]["signal"] == "SIGTERM"
        assert grace <= took < grace + 5.0, took
    else:
        assert report["run"]["signal"] == "SIGKILL"
        assert grace + term_grace <= took < grace + term_grace + 5.0, took


def test_a_second_ctrl_c_stops_it_at_once(tmp_path, validate_report):
    doctor, took, report = _interrupt(tmp_path, "term", presses=2)
    validate_report(report)
    assert doctor.returncode == exitcodes.INTERRUPTED and report["run"]["stopped"] == "interrupted"
    assert report["run"]["signal"] == "SIGKILL" and took < 2.5, took


RACE = """
import os, sys, time
from torchdoctor import lifetime

parent = os.getpid()
if os.fork() == 0:  # the child arms its death signal only after its parent is gone: the race
    while os.getppid() == parent:
        time.sleep(0.01)
    armed = lifetime.die_with_parent(parent) if sys.argv[1] == "parent" else lifetime.die_with_parent(None, watched=parent)
    open(sys.argv[2], "w").write(f"still here, armed={armed}")
    os._exit(0)
os._exit(0)
"""


@pytest.mark.parametrize("check", ["parent", "watched"])
def test_a_parent_gone_before_the_death_signal_is_armed_ends_the_child(tmp_path, check):
    """PR_SET_PDEATHSIG set after the parent died never fires: die_with_parent sees it and exits."""
    marker = tmp_path / "survived"
    subprocess.run([sys.executable, "-c", RACE, check, str(marker)], check=True, timeout=30)
    time.sleep(1.0)  # the orphan notices its new parent within 10 ms, then decides
    assert not marker.exists(), marker.read_text()

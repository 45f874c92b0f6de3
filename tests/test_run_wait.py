"""The supervisor's wait for the script's exit: one wake-up per poll where Linux has a pidfd."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from torchdoctor.run_process import open_pidfd, wait_exit

SLEEPER = [sys.executable, "-c", "import time; time.sleep(0.6)"]


def _wait_until_exit(proc: subprocess.Popen, pidfd: int | None) -> int:
    polls = 0
    deadline = time.monotonic() + 30
    while not wait_exit(proc, pidfd, 0.05):
        polls += 1
        assert time.monotonic() < deadline, "the child's exit was never seen"
    return polls


@pytest.mark.parametrize("use_pidfd", [True, False], ids=["pidfd", "popen-wait"])
def test_the_exit_is_seen_and_the_code_kept(use_pidfd):
    proc = subprocess.Popen(SLEEPER)
    pidfd = open_pidfd(proc.pid) if use_pidfd else None
    if use_pidfd and pidfd is None:
        pytest.skip("no pidfd_open on this system")
    try:
        assert not wait_exit(proc, pidfd, 0.05)  # still sleeping: the call comes back after its timeout
        assert _wait_until_exit(proc, pidfd) >= 1
        assert proc.returncode == 0
        assert wait_exit(proc, pidfd, 0.05)  # an exited child stays exited
    finally:
        if pidfd is not None:
            os.close(pidfd)
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not hasattr(resource, "RUSAGE_THREAD"), reason="per-thread context switches are Linux-only")
def test_a_pidfd_wait_wakes_once_where_popen_wait_polls():
    """Popen.wait(timeout) sleeps in steps of at most 50 ms; the pidfd wait blocks until the timeout."""
    switches = {}
    for label, make_fd in (("pidfd", open_pidfd), ("popen", lambda pid: None)):
        proc = subprocess.Popen(SLEEPER)
        pidfd = make_fd(proc.pid)
        if label == "pidfd" and pidfd is None:
            proc.kill()
            proc.wait()
            pytest.skip("no pidfd_open on this system")
        try:
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
            assert not wait_exit(proc, pidfd, 0.4)
            switches[label] = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
        finally:
            if pidfd is not None:
                os.close(pidfd)
            proc.kill()
            proc.wait()
    assert switches["pidfd"] <= 2, switches
    assert switches["popen"] >= 5, switches

"""Faults under `torchdoctor run`: real scripts that raise, exit, get killed, segfault, hang, time out.

Each scenario runs once (tests/test_run_support.py); every test checks the
documented exit code, a report.json valid against the schema, that no process
of the run is left and that no fixture file changed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.test_run_support import (
    RUN_FIXTURES,
    assert_sound,
    changed_files,
    processes_of,
    shared_run,
    tree_hash,
)
from torchdoctor import exitcodes
from torchdoctor.triage import read_errors

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def raised(tmp_path_factory):
    return shared_run(tmp_path_factory, "raises", "raises.py")


def test_exception_is_evidence_with_the_users_line(raised, validate_report):
    assert_sound(raised, validate_report, exitcodes.SCRIPT_FAILED)
    run = raised.run
    assert run["stopped"] == "crashed" and run["exit_code"] == 1 and run["steps_completed"] == 3
    error = run["error"]
    assert error["type"] == "RuntimeError"
    assert "mat1 and mat2 shapes cannot be multiplied (4x3 and 32x64)" in error["message"]
    assert error["location"]["path"] == "raises.py"
    assert error["location"]["line"] == 12 and error["location"]["code"] == "return model(batch)"
    assert error["step"] == 3


def test_exception_gets_the_same_diagnosis_as_a_pasted_traceback(raised):
    traceback_text = raised.stderr[raised.stderr.index("Traceback (most recent call last)"):]
    pasted, _, _ = read_errors(traceback_text)
    assert pasted, "the error-signature catalogue should know this PyTorch message"
    ids = [s["id"] for s in raised.report["symptoms"]]
    assert [s.id for s in pasted] == ids[: len(pasted)]
    first = raised.symptoms(pasted[0].id)[0]
    assert first["location"]["path"] == "raises.py" and first["location"]["line"] == 12
    assert first["step"] == 3
    assert first["evidence"][0]["values"] == pasted[0].evidence[0].values
    assert any(r["specialist"] == first["specialist"] for r in raised.report["reports"])


def test_the_script_still_prints_its_traceback_like_python(raised):
    err = raised.stderr
    assert "Traceback (most recent call last):" in err
    assert 'raises.py", line 15, in <module>' in err and 'raises.py", line 12, in evaluate' in err
    assert "bootstrap.py" not in err and "session.py" not in err
    assert err.rstrip().endswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 32x64)")


def test_sys_exit_code_is_recorded(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "exits", "exits.py")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    assert result.run["stopped"] == "exited"
    assert result.run["exit_code"] == 3 and result.run["signal"] is None
    assert result.run["steps_completed"] == 2 and result.run["error"] is None


def test_sigkill_keeps_what_was_measured(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "selfkill", "selfkill.py")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    run = result.run
    assert run["stopped"] == "killed" and run["signal"] == "SIGKILL" and run["exit_code"] is None
    assert run["steps_completed"] == 3
    assert run["measurements"]["memory"]["rss_last_step_mib"] > 0  # the per-step numbers survived the kill
    assert any("SIGKILL" in note for note in result.report["notes"])


def test_segfault_is_a_crash_with_the_faulthandler_stack(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "segfault", "segfault.py")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    assert result.run["stopped"] == "crashed" and result.run["signal"] == "SIGSEGV"
    assert result.run["steps_completed"] == 2
    crash = result.symptoms("native-crash")[0]
    assert crash["location"]["path"] == "segfault.py" and crash["location"]["line"] == 11
    assert result.report["artifacts"]["crash_stacks"] == os.path.join(result.run_dir, "crash.rank0.txt")
    text = open(result.report["artifacts"]["crash_stacks"]).read()
    assert "Segmentation fault" in text and 'segfault.py", line 11' in text


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    return shared_run(tmp_path_factory, "hangs", "hangs.py", "--hang-timeout", "3")


def test_hang_is_diagnosed_with_the_sleeping_line(hung, validate_report):
    assert_sound(hung, validate_report, exitcodes.SCRIPT_FAILED)  # the DataLoader workers are gone too
    assert hung.run["stopped"] == "hang" and hung.run["steps_completed"] == 2
    hang = hung.symptoms("hang")[0]
    assert hang["location"]["path"] == "hangs.py" and hang["location"]["line"] == 17
    assert hang["location"]["code"] == "time.sleep(3600)"
    values = hang["evidence"][0]["values"]
    assert values["hang_timeout_s"] == 3.0 and values["steps_completed"] == 2
    assert values["seconds_without_step"] >= 3.0 and values["threads"] >= 1
    assert 'hangs.py", line 17' in hang["evidence"][0]["quote"]
    assert hung.report["artifacts"]["stacks"].endswith("stacks.rank0.txt")


def test_hang_lets_the_probes_finish(hung):
    events = [json.loads(line) for line in open(os.path.join(hung.run_dir, "events.rank0.jsonl"))]
    assert events[-1]["kind"] == "exit" and events[-1]["reason"] == "terminated"
    assert "worker" not in hung.stderr.lower()  # the main process ended first and shut its workers down


@pytest.mark.heavy  # waits out --timeout
def test_timeout(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "timeout", "slow_forever.py", "--timeout", "6")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    run = result.run
    assert run["stopped"] == "timeout" and run["steps_completed"] >= 1
    assert 6.0 <= run["duration_s"] < 6.0 + 5.0 + 3.0  # the limit, the grace period, slack
    assert not result.symptoms("hang")
    # where the main thread was when the time ran out: the sleep, or inside the training step
    assert any(re.search(r"--timeout.*main thread was at (slow_forever|_tiny)\.py:\d+", note)
               for note in result.report["notes"])


def test_host_allocation_failure_is_an_oom(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "host_oom", "host_oom.py")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    oom = result.symptoms("oom")[0]
    assert oom["location"]["path"] == "host_oom.py" and oom["location"]["line"] == 9
    sources = {ev["source"] for ev in oom["evidence"]}
    assert "memory" in sources and len(sources) >= 2  # the probe's numbers merged with the signature's
    values = result.values("oom")
    assert values["requested_gib"] == 2**48 / 2**30 and values["device"] == "cpu" and values["rss_gib"] > 0


def test_ctrl_c_interrupts_and_cleans_up(tmp_path, validate_report):
    before = tree_hash(RUN_FIXTURES)
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchdoctor.cli", "run", "slow_forever.py", "--out", str(tmp_path), "-f", "json"],
        cwd=RUN_FIXTURES, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    # step records go to the memory-mapped steps file (probes/stepfile.py), not to the event stream
    files = [tmp_path / "events.rank0.jsonl", tmp_path / "steps.rank0.jsonl"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(f.exists() and b'"kind":"step"' in f.read_bytes() for f in files):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == exitcodes.INTERRUPTED, err.decode()[-2000:]
    report = validate_report(json.loads(out))
    assert report["run"]["stopped"] == "interrupted" and report["run"]["steps_completed"] >= 1
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert "KeyboardInterrupt" in err.decode()  # the script saw it, as under plain Python
    assert processes_of(tmp_path) == []
    assert changed_files(before, tree_hash(RUN_FIXTURES)) == []


def test_a_bug_in_the_diagnosis_still_leaves_the_runs_facts_and_exit_70(tmp_path, monkeypatch, capsys,
                                                                        validate_report):
    from torchdoctor import runner
    from torchdoctor.run_options import RunRequest

    script = tmp_path / "train.py"
    script.write_text("import torch\nw = torch.zeros(2, requires_grad=True)\nopt = torch.optim.SGD([w], lr=0.1)\n"
                      "for _ in range(3):\n    (w * 2).sum().backward()\n    opt.step()\n    opt.zero_grad()\n")

    def broken(plan, run):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(runner, "build_report", broken)
    monkeypatch.delenv("TORCHDOCTOR_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    code = runner.run_command(RunRequest(target=[str(script)], out=str(tmp_path / "run"), probes=["none"]))
    assert code == exitcodes.INTERNAL
    assert "internal error while diagnosing: RuntimeError: a bug of ours" in capsys.readouterr().err
    report = validate_report((tmp_path / "run" / "report.json").read_text())
    assert report["run"]["stopped"] == "completed" and report["run"]["steps_completed"] == 3
    assert "failed to diagnose this run" in report["notes"][0]

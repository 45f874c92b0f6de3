"""`torchdoctor run -- accelerate launch …` (issue 17): accelerate's processes each get the bootstrap.

The line is read without importing accelerate (the parent never imports torch); the runs use the real
accelerate package on CPU, one process and two (torchrun's ranks inside accelerate, gloo).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import FIXTURES, cli
from torchdoctor.consistency import contradictions
from torchdoctor.run_launch import LaunchError, launcher_of, parse_launcher_line
from torchdoctor.run_options import RunRequest, UsageError, make_plan

FRAMEWORKS = FIXTURES / "frameworks"
QUIET = ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
# The profile probe's timing findings on a tiny model depend on how busy the shared CPU is; every other warning
# fails a healthy run.
TIMING = {"launch-bound", "slow-step"}


def _alarms(report: dict) -> list[str]:
    return [s["id"] for s in report["symptoms"] if s["severity"] in ("error", "warning") and s["id"] not in TIMING]


# -- reading the line ------------------------------------------------------------------------------


@pytest.mark.parametrize("words, expected", [
    (["accelerate", "launch", "train.py"], "accelerate"),
    (["/opt/venv/bin/accelerate", "launch", "--cpu", "train.py"], "accelerate"),
    (["python", "-m", "accelerate.commands.launch", "train.py"], "accelerate"),
    (["python3.11", "-maccelerate.commands.launch", "train.py"], "accelerate"),
    (["torchrun", "--nproc-per-node", "2", "train.py"], "torchrun"),
    (["python", "-m", "torch.distributed.run", "train.py"], "torchrun"),
    (["accelerate", "config"], None),  # another accelerate command: not a launch
    (["accelerate"], None),
    (["train.py"], None),
])
def test_the_launcher_is_recognised(words, expected, tmp_path):
    assert launcher_of(words, str(tmp_path)) == expected


def test_a_script_named_accelerate_is_a_script(tmp_path):
    (tmp_path / "accelerate").write_text("print('mine')\n")
    assert launcher_of(["accelerate", "launch"], str(tmp_path)) is None


def test_accelerate_options_flags_values_and_spellings_are_kept_in_order(tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    words = ["accelerate", "launch", "--cpu", "--num-processes", "2", "--mixed_precision=no", "--multi_gpu",
             "--gradient_accumulation_steps", "4", "-q", "train.py", "--lr", "0.1", "--cpu"]
    launch = parse_launcher_line(words, str(tmp_path))
    assert launch.launcher == "accelerate" and not launch.module
    assert launch.options == ["--cpu", "--num-processes", "2", "--mixed_precision=no", "--multi_gpu",
                              "--gradient_accumulation_steps", "4", "-q"]
    assert launch.target == "train.py" and launch.args == ["--lr", "0.1", "--cpu"]  # the script's own --cpu
    assert launch.argv() == [sys.executable, "-m", "accelerate.commands.launch", *launch.options, "--module",
                             "torchdoctor.probes.bootstrap", "train.py", "--lr", "0.1", "--cpu"]
    assert launch.typed == words


def test_accelerates_machine_options_are_the_rendezvous(tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    launch = parse_launcher_line(["accelerate", "launch", "--num-machines", "2", "--machine_rank", "1",
                                  "--main_process_ip", "10.0.0.1", "--main-process-port", "29400", "train.py"],
                                 str(tmp_path))
    assert launch.rendezvous() == {"nnodes": "2", "node_rank": "1", "endpoint": "10.0.0.1:29400"}
    assert launch.node_rank == 1


def test_accelerate_module_target_runs_through_the_bootstrap_as_a_module(tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    launch = parse_launcher_line(["python", "-m", "accelerate.commands.launch", "-m", "pkg.train", "--x", "1"],
                                 str(tmp_path))
    assert launch.module and launch.target == "pkg.train" and launch.args == ["--x", "1"]
    assert launch.argv()[3:] == ["--module", "torchdoctor.probes.bootstrap", "-m", "pkg.train", "--x", "1"]


@pytest.mark.parametrize("words, message", [
    (["accelerate", "launch", "--help"], "run it without torchdoctor"),
    (["accelerate", "launch", "--no-python", "train.sh"], "not Python"),
    (["accelerate", "launch", "--cpu"], "no training script"),
])
def test_lines_torchdoctor_cannot_start_are_one_sentence(words, message, tmp_path):
    with pytest.raises(LaunchError, match=message):
        parse_launcher_line(words, str(tmp_path))


def test_run_m_accelerate_is_the_same_launch_and_mixing_own_options_is_a_usage_error(tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    (tmp_path / "train.py").write_text("print('x')\n")
    plan = make_plan(RunRequest(module="accelerate.commands.launch", target=["--cpu", "train.py", "a"],
                                out=str(tmp_path / "out")), cwd=str(tmp_path))
    assert plan.launch is not None and plan.launch.launcher == "accelerate"
    assert plan.script == "train.py" and plan.args == ["a"] and plan.user_command[1:3] == ["-m",
                                                                                          "accelerate.commands.launch"]
    with pytest.raises(UsageError, match="not both"):
        make_plan(RunRequest(target=["accelerate", "launch", "train.py"], nproc_per_node="2",
                             out=str(tmp_path / "out2")), cwd=str(tmp_path))


# -- real runs -----------------------------------------------------------------------------------


def _run(tmp_path, *line: str, timeout: float = 300):
    out = tmp_path / "run"
    proc = cli("run", "--out", str(out), "--format", "json", "--", *line, cwd=str(tmp_path),
               env={"HF_HOME": str(tmp_path / "hf")}, timeout=timeout)
    assert proc.stdout_text.strip(), proc.stderr_text
    report = json.loads(proc.stdout_text)
    assert not contradictions(report), [str(c) for c in contradictions(report)]  # the advice fits Accelerate
    return proc, report


@pytest.mark.heavy
@pytest.mark.slow
def test_accelerate_launch_counts_the_real_steps_and_finds_nothing_in_a_healthy_loop(tmp_path, validate_report):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    proc, report = _run(tmp_path, "accelerate", "launch", "--cpu", "--num_processes", "1", *QUIET,
                        str(FRAMEWORKS / "accelerate_healthy.py"))
    validate_report(report)
    assert proc.returncode == 0, proc.stderr_text
    assert "rank 0 of 1: 40 steps" in proc.stderr_text  # --format json: the script's stdout goes to stderr
    assert report["run"]["steps_completed"] == 40 and report["run"]["stopped"] == "completed"
    assert report["run"]["command"][:2] == ["accelerate", "launch"]
    assert _alarms(report) == [], report["symptoms"]


@pytest.mark.heavy
@pytest.mark.slow
def test_run_m_accelerate_commands_launch_counts_the_steps(tmp_path, validate_report):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    out = tmp_path / "run"
    proc = cli("run", "--out", str(out), "--format", "json", "-m", "accelerate.commands.launch", "--", "--cpu",
               "--num_processes", "1", *QUIET, str(FRAMEWORKS / "accelerate_healthy.py"), cwd=str(tmp_path),
               env={"HF_HOME": str(tmp_path / "hf")}, timeout=300)
    assert proc.returncode == 0, proc.stderr_text
    report = validate_report(proc.stdout_text)
    assert report["run"]["steps_completed"] == 40
    assert not [s for s in report["symptoms"] if s["id"] == "nothing-measured"]


@pytest.mark.heavy
@pytest.mark.slow
def test_a_leak_under_accelerate_launch_is_found_at_its_line(tmp_path, validate_report):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    proc, report = _run(tmp_path, "accelerate", "launch", "--cpu", "--num_processes", "1", *QUIET,
                        str(FRAMEWORKS / "accelerate_leak.py"))
    validate_report(report)
    growth = [s for s in report["symptoms"] if s["id"] == "memory-growth"]
    assert growth and growth[0]["severity"] == "error", report["symptoms"]
    lines = (FRAMEWORKS / "accelerate_leak.py").read_text().splitlines()
    assert growth[0]["location"]["line"] == lines.index("    history.append(loss)") + 1
    assert proc.returncode == 1


@pytest.mark.heavy
@pytest.mark.slow
def test_a_schedule_mistake_under_accelerate_is_found_at_the_users_line_in_accelerates_terms(tmp_path,
                                                                                             validate_report):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    proc, report = _run(tmp_path, "accelerate", "launch", "--cpu", "--num_processes", "1", *QUIET,
                        str(FRAMEWORKS / "accelerate_sched.py"))
    validate_report(report)
    found = [s for s in report["symptoms"] if s["id"] == "scheduler-granularity"]
    assert found and found[0]["severity"] == "error", report["symptoms"]
    lines = (FRAMEWORKS / "accelerate_sched.py").read_text().splitlines()
    assert found[0]["location"]["line"] == 1 + next(i for i, t in enumerate(lines) if "CosineAnnealingLR(" in t)
    assert report["contexts"] == ["accelerate"]
    titles = [f["title"] for r in report["reports"] for f in r["fixes"]]
    assert titles[:2] == ["Accelerate: Prepare the scheduler with the optimizer", "Step per-epoch schedules once per epoch"]


@pytest.mark.heavy
@pytest.mark.slow
def test_accelerates_accumulation_and_a_second_division_are_found_at_the_backward_line(tmp_path, validate_report):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    proc, report = _run(tmp_path, "accelerate", "launch", "--cpu", "--num_processes", "1", *QUIET,
                        str(FRAMEWORKS / "accelerate_accum.py"))
    validate_report(report)
    assert report["run"]["steps_completed"] == 10
    found = [s for s in report["symptoms"] if s["id"] == "accumulation-divided-twice"]
    assert found, report["symptoms"]
    lines = (FRAMEWORKS / "accelerate_accum.py").read_text().splitlines()
    assert found[0]["location"]["line"] == 1 + lines.index("        accelerator.backward(loss)")
    # The framework's knob comes first in the report that treats the accumulation (a timing warning of
    # the profile probe on a loaded machine may come before that report; it is not what is tested here).
    [titles] = [[f["title"] for f in r["fixes"]] for r in report["reports"]
                if any("ccumulat" in f["title"] for f in r["fixes"])]
    assert titles[0].startswith("Accelerate: Accumulate with Accelerator(gradient_accumulation_steps=N)"), titles


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_two_accelerate_processes_each_run_the_probes(tmp_path, validate_report):
    pytest.importorskip("accelerate", reason="accelerate is an optional test extra")
    proc, report = _run(tmp_path, "accelerate", "launch", "--multi_gpu", "--num_processes", "2", *QUIET,
                        str(FRAMEWORKS / "accelerate_healthy.py"))
    validate_report(report)
    assert proc.returncode == 0, proc.stderr_text
    assert "rank 0 of 2: 10 steps" in proc.stderr_text and "rank 1 of 2: 10 steps" in proc.stderr_text
    assert report["run"]["ranks"] == 2 and report["run"]["steps_completed"] == 10
    assert sorted(p.name for p in (tmp_path / "run").glob("events.rank*.jsonl")) == [
        "events.rank0.jsonl", "events.rank1.jsonl"]
    assert _alarms(report) == [], report["symptoms"]


@pytest.mark.heavy
@pytest.mark.slow
def test_gradients_without_an_optimizer_step_are_a_warning_not_no_symptoms(tmp_path, validate_report):
    out = tmp_path / "run"
    proc = cli("run", str(FRAMEWORKS / "manual_update.py"), "--out", str(out), "--fail-on", "warning",
               timeout=240)
    assert proc.returncode == 1, proc.stderr_text
    assert "No symptoms found." not in proc.stdout_text
    report = validate_report((out / "report.json").read_text())
    blind = [s for s in report["symptoms"] if s["id"] == "nothing-measured"]
    assert len(blind) == 1 and blind[0]["severity"] == "warning"
    assert blind[0]["evidence"][0]["values"]["backward_passes"] == 20
    assert "20 backward passes ran" in report["reports"][0]["diagnosis"]

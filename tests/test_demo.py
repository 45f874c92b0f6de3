"""`torchdoctor demo`: the bundled patient, diagnosed end to end by check and run."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli, repeated_lines

PLANTED = {
    "memory-growth",  # total_loss += loss
    "eval-without-no-grad",  # validation with autograd on
    "eval-mode-missing",  # ... and dropout active
    "nonfinite-input",  # a zero standard deviation turns one batch into NaN before the model
    "scheduler-granularity",  # OneCycleLR stepped per epoch
    "checkpoint-incomplete",  # weights only
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("user-folder")
    proc = cli("demo", "--format", "json", cwd=cwd, timeout=300)
    return proc, cwd


def test_demo_finds_every_planted_problem(demo, validate_report):
    proc, _ = demo
    assert proc.returncode == 0, proc.stderr_text[-2000:]
    report = validate_report(proc.stdout_text)
    found = {s["id"] for s in report["symptoms"]}
    assert PLANTED <= found, PLANTED - found
    assert report["run"]["stopped"] == "completed" and report["run"]["steps_completed"] > 0
    assert {f["code"] for f in report["findings"]} >= {"TD101", "TD102", "TD406", "TD601", "TD701"}
    assert len(report["reports"]) >= 4 and all(r["fixes"] for r in report["reports"])


@pytest.fixture(scope="module")
def demo_text(tmp_path_factory):
    """The demo as a user pipes it: plain text, 100 columns (a second run: ~35 s on an idle CPU)."""
    return cli("demo", cwd=tmp_path_factory.mktemp("user-folder-text"), env={"COLUMNS": "100"}, timeout=300)


@pytest.mark.heavy  # a second whole demo run (the JSON one stays in the quick suite)
def test_demo_summary_fits_one_screen_and_says_nothing_twice(demo_text):
    proc = demo_text
    assert proc.returncode == 0, proc.stderr_text[-2000:]
    lines = proc.stdout_text.splitlines()
    assert len(lines) <= 60, proc.stdout_text
    assert all(len(line) <= 100 for line in lines)
    assert not repeated_lines(proc.stdout_text)
    found = {line.split()[1] for line in lines if line.startswith(("error ", "warning "))}  # the symptom rows
    assert PLANTED <= found, PLANTED - found
    assert "The script completed" in proc.stdout_text and "ms per step (median)" in proc.stdout_text
    assert "--details" in proc.stdout_text and "Fix 1:" not in proc.stdout_text


def test_no_symptom_holds_the_same_evidence_twice(demo):
    """`run` already carries the static findings its measurements confirm; the demo used to add check's
    symptoms for them again, and every such finding was listed twice."""
    report = json.loads(demo[0].stdout_text)
    for symptom in report["symptoms"]:
        said = [json.dumps(ev, sort_keys=True) for ev in symptom["evidence"]]
        assert len(said) == len(set(said)), symptom["id"]


def test_a_mistake_seen_by_a_rule_and_a_probe_is_one_symptom_with_both_kinds_of_evidence(demo):
    report = json.loads(demo[0].stdout_text)
    growth = [s for s in report["symptoms"] if s["id"] == "memory-growth"]
    assert len(growth) == 1
    kinds = {e["kind"] for e in growth[0]["evidence"]}
    assert kinds == {"static", "probe"}
    assert growth[0]["location"]["path"] == "train_demo.py"


def test_demo_leaves_the_working_folder_alone(demo):
    _, cwd = demo
    assert list(cwd.iterdir()) == []


def _next_step_commands(report) -> list[list[str]]:
    import re
    import shlex

    commands = []
    for fix_report in report["reports"]:
        for step in fix_report["next_steps"]:
            commands += [shlex.split(c) for c in re.findall(r"`(torchdoctor [^`]+)`", step)]
    return commands


def test_every_path_the_demo_names_exists_after_it(demo):
    """The next steps name the patient script, and the artifacts the run directory: the demo keeps both,
    by absolute path, so they can be followed from the user's folder."""
    import os

    proc, cwd = demo
    report = json.loads(proc.stdout_text)
    commands = _next_step_commands(report)
    assert commands and any(c[1] == "run" for c in commands) and any(c[1] == "check" for c in commands)
    named = [token for command in commands for token in command if token.endswith((".py", ".ipynb"))]
    assert named and all(os.path.isabs(p) and os.path.isfile(p) for p in named), named
    assert all(os.path.isabs(p) and os.path.exists(p) for p in report["artifacts"].values()), report["artifacts"]
    for command in commands:
        if command[1] == "check":  # quick to follow for real, from the user's folder
            followed = cli(*command[1:], cwd=cwd)
            assert followed.returncode in (0, 1) and followed.stderr_text == "", followed.stderr_text
            assert "train_demo.py" in followed.stdout_text


def test_the_demo_page_shows_both_doors_and_the_charts(demo):
    from pathlib import Path

    report = json.loads(demo[0].stdout_text)
    page = Path(report["artifacts"]["report_html"]).read_text(encoding="utf-8")
    assert "<title>torchdoctor demo train_demo.py</title>" in page and "Static findings" in page
    assert "Loss per optimizer step" in page and "What holds the leak: `total_loss`" in page

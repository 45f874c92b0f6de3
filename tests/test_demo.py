"""`torchdoctor demo`: the bundled patient, diagnosed end to end by check and run."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli

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

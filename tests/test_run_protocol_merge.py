"""`run` reads the script with `check`'s rules too: where both doors see the same mistake, the report has one
symptom with the rule's line (static evidence) and the probe's numbers (probe evidence) — in JSON, in the
terminal and in Markdown.

The runs are the ones of test_run_protocol.py (shared per session); the rendering runs are their own.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.conftest import cli
from tests.test_run_protocol import checkpoint_run, protocol_run
from tests.test_run_support import RUN_FIXTURES

# (scenario, symptom, the static rule that sees the same mistake, the rule's line)
AGREEMENT = [
    ("sched_epoch", "scheduler-granularity", "TD406", 19),
    ("sched_batch", "scheduler-granularity", "TD407", 19),
    ("sched_batch", "scheduler-order", "TD408", 19),
    ("amp_fp16", "fp16-without-scaler", "TD402", 13),
    ("amp_scaler", "clip-before-unscale", "TD403", 17),
    ("amp_scaler", "scaler-with-bf16", "TD404", 9),
    ("accum_bad", "accumulation-not-normalized", "TD409", 18),
    ("eval_bad", "eval-without-no-grad", "TD102", 18),
    ("eval_bad", "eval-mode-missing", "TD601", 18),
    ("eval_restore", "eval-mode-missing", "TD602", 26),  # the evaluate() call, where train() belongs
    ("ckpt_bad", "checkpoint-incomplete", "TD701", 27),
    ("ckpt_bad", "whole-model-pickled", "TD704", 29),
    ("ckpt_bad", "unsafe-load", "TD702", 32),
    ("ckpt_bad", "state-dict-mismatch", "TD705", 37),
    ("flow_bad", "non-differentiable", "TD805", 22),
]


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "symptom_id", "code", "line"), AGREEMENT,
                         ids=[f"{s}-{c}" for s, _, c, _ in AGREEMENT])
def test_both_doors_merge_into_one_symptom(tmp_path_factory, scenario, symptom_id, code, line):
    result = checkpoint_run(tmp_path_factory) if scenario == "ckpt_bad" else protocol_run(tmp_path_factory, scenario)
    found = result.symptoms(symptom_id)
    assert len(found) == 1, f"{symptom_id} not merged into one symptom: {len(found)}"
    evidence = found[0]["evidence"]
    static = [e for e in evidence if e["kind"] == "static" and e["source"] == code]
    probe = [e for e in evidence if e["kind"] == "probe"]
    assert static, f"no {code} evidence in {[e['source'] for e in evidence]}"
    assert static[0]["location"]["line"] == line and f"[{code}]" in static[0]["summary"]
    assert probe and any(isinstance(v, (int, float)) and not isinstance(v, bool)
                         for e in probe for v in e["values"].values()), "the probe evidence carries no numbers"
    assert f"{code} line {line}" in result.run["measurements"]["check"]["confirmed"]
    report = next(r for r in result.report["reports"] if symptom_id in r["symptoms"])
    assert any(f"[{code}]" in item for item in report["evidence"])  # the specialist saw both kinds too


@pytest.mark.slow
def test_static_findings_nothing_measured_stay_a_note(tmp_path_factory):
    # proto_amp_fp16.py under the schedule probe alone: TD402 has no measured counterpart here.
    result = protocol_run(tmp_path_factory, "amp_fp16")
    assert result.run["measurements"]["check"]["not_measured"] == []
    solo = tmp_path_factory.mktemp("solo")
    proc = cli("run", "proto_amp_fp16.py", "--out", str(solo), "--probe", "schedule", "-f", "json", cwd=RUN_FIXTURES)
    report = json.loads(proc.stdout_text)
    assert proc.returncode == 0 and not report["symptoms"]  # the exit code stays about what was measured
    assert any("TD402 fp16-without-scaler (line 13)" in n and "not confirmed" in n for n in report["notes"])


@pytest.mark.slow
def test_merged_evidence_in_the_terminal_and_projection_at_steps(tmp_path):
    proc = cli("run", "proto_sched_epoch.py", "--out", str(tmp_path), "--probe", "schedule", "--steps", "25",
               "--details", cwd=RUN_FIXTURES)
    assert proc.returncode == 1, proc.stderr_text[-2000:]
    text = proc.stdout_text
    block = text.split("scheduler-granularity —", 1)[1].split("Route", 1)[0]
    assert "- measured: OneCycleLR is sized for 40 optimizer steps" in block
    assert "- in the source (line 19):" in block and "[TD406]" in block
    assert "intended" in block and "as stepped" in block
    report = json.loads((tmp_path / "report.json").read_text())
    values = next(e["values"] for e in report["symptoms"][0]["evidence"] if e["kind"] == "probe")
    assert report["run"]["stopped"] == "steps" and values["projected"] is True
    assert values["lr_steps_taken"] == 4 and values["used_fraction"] == pytest.approx(0.1)


@pytest.mark.slow
def test_merged_evidence_in_markdown(tmp_path):
    proc = cli("run", "proto_eval_bad.py", "--out", str(tmp_path), "--probe", "validation", "-f", "markdown",
               cwd=RUN_FIXTURES)
    assert proc.returncode == 0, proc.stderr_text[-2000:]
    md = proc.stdout_text
    details = md.split("## Details", 1)[1]  # Markdown holds the full report after the summary
    block = details.split("eval-without-no-grad", 1)[1].split("eval-mode-missing", 1)[0]
    assert "measured: 6 forward passes of Sequential recorded an autograd graph" in block
    assert "in the source (line 18):" in block and "[TD102]" in block


# -- the merge itself, in process ---------------------------------------------------------------------


def _plan(script: str) -> SimpleNamespace:
    return SimpleNamespace(script=script, module=None, cwd=str(RUN_FIXTURES))


def test_add_static_then_diagnose_merges(monkeypatch):
    from torchdoctor.analysis import RunAnalysis
    from torchdoctor.analysis.static import add_static
    from torchdoctor.diagnosis import diagnose
    from torchdoctor.model import Evidence, Report
    from torchdoctor.rules.catalog import make_symptom

    monkeypatch.delenv("TORCHDOCTOR_RUN_CHECK", raising=False)
    measured = make_symptom("scheduler-granularity", evidence=[
        Evidence(kind="probe", summary="stepped once per epoch", values={"lr_steps_planned": 40}, source="schedule")])
    found = RunAnalysis(symptoms=[measured])
    add_static(_plan("proto_sched_epoch.py"), found)
    assert [s.id for s in found.symptoms] == ["scheduler-granularity", "scheduler-granularity"]
    report = diagnose(Report(command="run", target="proto_sched_epoch.py", symptoms=found.symptoms))
    assert len(report.symptoms) == 1
    assert [e.kind for e in report.symptoms[0].evidence] == ["probe", "static"]
    assert report.symptoms[0].evidence[1].location.line == 19
    assert found.measurements["check"]["confirmed"] == ["TD406 line 19"]


def test_add_static_notes_what_was_not_measured_and_can_be_turned_off(monkeypatch):
    from torchdoctor.analysis import RunAnalysis
    from torchdoctor.analysis.static import add_static

    found = RunAnalysis()
    add_static(_plan("proto_accum_bad.py"), found)
    assert found.symptoms == []
    assert "TD409 accumulation-not-normalized (line 18)" in found.notes[0]
    monkeypatch.setenv("TORCHDOCTOR_RUN_CHECK", "0")
    off = RunAnalysis()
    add_static(_plan("proto_accum_bad.py"), off)
    assert off.notes == [] and "check" not in off.measurements


def test_add_static_finds_the_file_that_ran(tmp_path):
    from torchdoctor.analysis.static import script_path

    assert script_path("proto_healthy.py", None, str(RUN_FIXTURES)) == RUN_FIXTURES / "proto_healthy.py"
    assert script_path(None, "mypkg.train", str(RUN_FIXTURES)) == RUN_FIXTURES / "mypkg" / "train.py"
    assert script_path("missing.py", None, str(tmp_path)) is None

"""No report contradicts its own numbers: every door's fixtures checked against rules/data/contradictions.toml."""

from __future__ import annotations

import re

import pytest

from tests import doors
from torchdoctor import specialists
from torchdoctor.consistency import checks, contradictions, measured
from torchdoctor.model import Evidence, Report
from torchdoctor.rules import catalog, evidence


def _found(reports) -> list[str]:
    return [f"{name}: {c}" for name, report in reports
            for c in contradictions(report if isinstance(report, dict) else report.to_dict())]


def test_every_check_catches_its_own_example():
    for check in checks():
        from torchdoctor.rules.catalog import load_toml

        row = next(r for r in load_toml("contradictions.toml")["contradiction"] if r["id"] == check.id)
        assert check.says.search(row["example"]), check.id
        for sid in check.measured.get("symptom", []):
            catalog.symptom(sid)


def _report(symptom: str, values: dict, diagnosis: str, measurements: dict | None = None) -> dict:
    return {"symptoms": [{"id": symptom, "evidence": [{"kind": "probe", "values": values}]}],
            "reports": [{"specialist": "debugging", "diagnosis": diagnosis, "fixes": [], "next_steps": []}],
            "run": {"measurements": measurements or {}}}


def test_a_report_that_contradicts_itself_is_caught():
    said = "The gradients checked were finite, so look at the update."
    [found] = [c for c in contradictions(_report("nonfinite-grad", {}, said)) if c.check == "finite-beside-nonfinite"]
    assert found.specialist == "debugging" and "finite" in found.words
    assert not contradictions(_report("slow-step", {}, said))  # nothing non-finite measured: nothing to contradict
    sgd = _report("resume-optimizer-state-missing", {"stepping_optimizer": "SGD"}, "Adam's moments restart.")
    assert [c.check for c in contradictions(sgd)] == ["adam-advice-for-sgd"]
    adam = _report("resume-optimizer-state-missing", {"stepping_optimizer": "AdamW"}, "Adam's moments restart.")
    assert not contradictions(adam)


def test_measurements_count_as_numbers_too():
    report = _report("nan-loss", {}, "x", measurements={"nan": {"nonfinite_grad_steps": 51}})
    assert measured(report, {"key": "nonfinite_grad_steps", "above": 0})
    assert not measured(report, {"key": "nonfinite_grad_steps", "above": 60})
    assert measured(report, {"symptom": ["nan-loss"]}) and not measured(report, {"symptom": ["oom"]})


def test_no_ask_report_contradicts_itself():
    reports = list(doors.ask_reports())
    assert not _found(reports)
    forms = {c for _, r in reports for fr in r.reports for f in fr.fixes
             if (f.applies_when or "").startswith("training with ") for c in r.contexts}
    assert {"lightning", "hf-trainer"} <= forms  # framework advice was there to be checked


def test_no_check_report_contradicts_itself():
    reports = list(doors.check_reports())
    assert not _found(reports)
    # the framework fixtures are among them: the framework-fit checks had reports to read
    assert {"lightning", "hf-trainer", "accelerate"} <= {c for _, r in reports for c in r.contexts}
    assert any((f.applies_when or "").startswith("training with Accelerate")
               for _, r in reports for fr in r.reports for f in fr.fixes)


def test_no_recorded_run_report_contradicts_itself():
    assert not _found(doors.recorded_run_reports())


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> list[tuple[str, dict]]:
    return doors.live_runs(tmp_path_factory.mktemp("live"))


@pytest.mark.heavy  # several whole runs; the fixtures' reports stay in the quick suite
def test_no_live_run_report_contradicts_itself(live):
    symptoms = {name: {s["id"] for s in report["symptoms"]} for name, report in live}
    # the measurements the wording is checked against are there
    assert "nonfinite-grad" in symptoms["run:nan_grad_norm.py"]
    assert "resume-optimizer-state-missing" in symptoms["run:resume_optimizer.py"]
    assert not _found(live)


def test_live_runs_emit_only_declared_values_of_their_type(live):
    wrong = [f"{name}: {p}" for name, report in live for s in report["symptoms"] for ev in s["evidence"]
             for p in evidence.problems(ev["kind"], ev.get("source"), ev.get("values") or {})]
    assert not wrong, wrong


# -- advice that fits what was measured -----------------------------------------------------------


def _advise(symptom: str, specialist: str, values: dict) -> str:
    ev = Evidence(kind="probe", summary="measured", values=values, source="checkpoint")
    report = specialists.consult(specialist, [catalog.make_symptom(symptom, evidence=[ev])], command="run")
    return " ".join([report.diagnosis] + [f"{f.title} {f.snippet or ''}" for f in report.fixes])


def test_resume_advice_names_the_optimizer_that_stepped():
    sgd = _advise("resume-optimizer-state-missing", "checkpointing", {"how": "replaced", "stepping_optimizer": "SGD"})
    assert "SGD's momentum buffers" in sgd and "torch.optim.SGD(" in sgd
    assert not re.search(r"\bAdam", sgd)
    adam = _advise("resume-optimizer-state-missing", "checkpointing", {"how": "replaced", "stepping_optimizer": "Adam"})
    assert "Adam's moment estimates" in adam and "torch.optim.Adam(" in adam


def test_set_epoch_called_with_one_value_is_not_called_never_called():
    called = _advise("sampler-epoch-not-set", "distributed", {"epochs": 3, "set_epoch_calls": 3})
    assert "calls sampler.set_epoch 3 times, always with the same epoch" in called
    assert "never calls" not in called
    never = _advise("sampler-epoch-not-set", "distributed", {"epochs": 3, "set_epoch_calls": 0})
    assert "never calls sampler.set_epoch" in never


# -- advice that fits the framework measured -----------------------------------------------------


def _framework_report(symptom: str, specialist: str, advised: list[str], measured: list[str]) -> dict:
    """A real fix report advised for the contexts `advised`, in a report whose contexts are `measured`:
    what a door would write if the framework it found and the one the advice was given for differed."""
    found = catalog.make_symptom(symptom)
    fix_report = specialists.consult(specialist, [found], contexts=advised, command="run")
    return Report(command="run", target="train.py", symptoms=[found], contexts=measured, reports=[fix_report]).to_dict()


def _checks(report: dict) -> set[str]:
    return {c.check for c in contradictions(report)}


@pytest.mark.parametrize("symptom, specialist", [("mixed-precision-setup", "mixed-precision"),
                                                 ("exploding-gradients", "debugging")])
def test_plain_advice_without_the_frameworks_own_setting_is_caught(symptom, specialist):
    for framework in ("lightning", "hf-trainer", "accelerate"):
        plain = _framework_report(symptom, specialist, [], [framework])  # a GradScaler / clip_grad_norm_ alone
        assert _checks(plain) == {"framework-form-missing"}, framework
        fitting = _framework_report(symptom, specialist, [framework], [framework])
        assert not _checks(fitting), framework
    without = _framework_report(symptom, specialist, [], [])
    assert not _checks(without)


def test_another_frameworks_advice_is_caught():
    cases = [  # (advised for, measured, the wording check that also fires)
        (["hf-trainer"], ["lightning"], "trainer-or-accelerate-advice-in-lightning-run"),
        (["accelerate"], ["lightning"], "trainer-or-accelerate-advice-in-lightning-run"),
        (["lightning"], ["hf-trainer", "accelerate"], "lightning-or-loop-advice-in-trainer-run"),
        (["accelerate"], ["hf-trainer", "accelerate"], "lightning-or-loop-advice-in-trainer-run"),
        (["lightning"], ["accelerate"], "lightning-or-trainer-advice-in-accelerate-run"),
        (["hf-trainer"], ["accelerate"], "lightning-or-trainer-advice-in-accelerate-run"),
    ]
    for advised, measured_contexts, wording in cases:
        found = _checks(_framework_report("exploding-gradients", "debugging", advised, measured_contexts))
        assert {"other-framework-form", wording} <= found, (advised, measured_contexts, found)
    # a framework's form in a report that found no framework at all
    assert _checks(_framework_report("exploding-gradients", "debugging", ["lightning"], [])) == {"other-framework-form"}
    # the Trainer runs on Accelerate: its report holds both contexts, and the Trainer's advice fits it
    assert not _checks(_framework_report("exploding-gradients", "debugging", ["hf-trainer", "accelerate"],
                                         ["hf-trainer", "accelerate"]))


def test_not_context_excludes_a_report_holding_any_of_them():
    report = {"contexts": ["accelerate"], "symptoms": [], "reports": []}
    assert measured(report, {"context": "accelerate", "not_context": ["lightning"]})
    assert not measured(report, {"context": "accelerate", "not_context": ["hf-trainer", "accelerate"]})


# -- one owner per fix ----------------------------------------------------------------------------


def _snippet_owners(report) -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    for fix_report in report.reports:
        for fix in fix_report.fixes:
            if fix.snippet:
                owners.setdefault(fix.snippet.strip(), []).append(fix_report.specialist)
    return owners


@pytest.mark.parametrize("signature", ["inductor-backend-failed", "dataloader-bus-error"])
def test_a_fix_is_given_by_one_specialist_of_a_report(signature):
    from torchdoctor.ask import build_report

    example = next(text for name, text in doors.ask_texts() if name == f"ask:signature:{signature}")
    report = build_report(example)
    assert len(report.reports) >= 2  # two specialists answer it
    shared = {snippet: who for snippet, who in _snippet_owners(report).items() if len(who) > 1}
    assert not shared, shared


def test_compile_failed_bisect_belongs_to_profiling_and_debugging_adds_the_minifier():
    from torchdoctor.ask import build_report

    example = next(text for name, text in doors.ask_texts() if name == "ask:signature:inductor-backend-failed")
    by = {r.specialist: r for r in build_report(example).reports}
    assert any("backend='aot_eager'" in (f.snippet or "") for f in by["profiling"].fixes)
    assert [f.snippet.split()[0] for f in by["debugging"].fixes] == ["TORCHDYNAMO_REPRO_AFTER=aot"]

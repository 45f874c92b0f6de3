"""A site that does otherwise than the project's other sites (rules/static/semantic/practice.py).

Each case folder under tests/fixtures/check/practice/<case>/ is a project of two or three files: `bad/` has one
evaluation function that deviates from the project's others (its `# BUG` line), `good/` is the same project where
every function agrees, and the other folders keep the deviation but give it a context that differs on purpose
(an evaluation that needs gradients, a caller that switches the mode first, a file under tests/): all silent.
"""

from __future__ import annotations

import pytest

from tests.check_variants_support import VARIANTS, findings, marked, near

PRACTICE = VARIANTS.parent / "practice"
CODES = {"grad": {"TD102"}, "mode": {"TD601"}}
CASES = sorted((case, d.name) for case in CODES for d in (PRACTICE / case).iterdir() if d.is_dir())


def test_every_case_has_a_deviant_a_twin_and_a_context():
    for case in CODES:
        folders = {d for c, d in CASES if c == case}
        assert {"bad", "good"} <= folders and len(folders) >= 3, case


@pytest.mark.parametrize("case", sorted(CODES))
def test_the_deviant_is_reported_at_info_with_its_sibling(case, monkeypatch):
    from torchdoctor.check import CheckRequest, build_report, prepare

    folder = PRACTICE / case / "bad"
    lines = marked(folder)
    assert len(lines) == 1, lines
    found = findings(folder, monkeypatch, CODES[case])
    assert near(found, lines), (lines, found)
    monkeypatch.chdir(folder)
    request = CheckRequest(paths=["."], fmt="json", fail_on="never")
    reported = [f for f in build_report(request, prepare(request)).findings if f.code in CODES[case]]
    assert [f.severity for f in reported] == ["info"]
    # the message names the sibling that answers the same question the project's way, with its place
    sibling = "classifier_trainer.py:15" if case == "grad" else "evaluation.py:10"
    assert sibling in reported[0].message and "other evaluation functions" in reported[0].message


@pytest.mark.parametrize(("case", "folder"), [c for c in CASES if c[1] != "bad"], ids=[f"{c}/{d}" for c, d in CASES
                                                                                     if d != "bad"])
def test_agreeing_sites_and_purposeful_contexts_are_silent(case, folder, monkeypatch):
    assert findings(PRACTICE / case / folder, monkeypatch, CODES[case]) == []


def test_the_answer_does_not_depend_on_the_order_files_are_named(monkeypatch):
    from torchdoctor.check import CheckRequest, build_report, prepare

    monkeypatch.chdir(PRACTICE / "grad" / "bad")
    seen = []
    for paths in (["classifier_trainer.py", "language_model_trainer.py"],
                  ["language_model_trainer.py", "classifier_trainer.py"]):
        request = CheckRequest(paths=paths, fmt="json", fail_on="never")
        seen.append(sorted((f.path, f.line, f.message) for f in build_report(request, prepare(request)).findings
                           if f.code == "TD102"))
    assert seen[0] == seen[1] and len(seen[0]) == 1

"""Constant advice as data (rules/data/advice/<specialist>.toml): every fix the code names exists, every fix there is used."""

from __future__ import annotations

import ast
from pathlib import Path

from torchdoctor import specialists
from torchdoctor.model import Evidence
from torchdoctor.rules import catalog
from torchdoctor.specialists import advice

SPECIALISTS = Path(__file__).resolve().parents[1] / "specialists"
# specialists whose constant fixes all live in rules/data/advice/<specialist>.toml: one file per moved specialist
MOVED = tuple(name.removeprefix("advice/").removesuffix(".toml") for name in advice.files())


def _calls() -> list[tuple[str, str, set[str], str]]:
    """Every `advice.fix("<specialist>", "<id>", ..., field=...)` in the specialists: its keywords and where."""
    calls = []
    for path in SPECIALISTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fix"
                    and getattr(node.func.value, "id", None) == "advice"):
                specialist, fix_id = (a.value for a in node.args[:2])  # type: ignore[attr-defined]
                fields = {k.arg for k in node.keywords if k.arg and k.arg != "location"}
                calls.append((specialist, fix_id, fields, f"{path.name}:{node.lineno}"))
    return calls


def _named_in_code() -> set[tuple[str, str]]:
    return {(specialist, fix_id) for specialist, fix_id, _, _ in _calls()}


def test_every_call_passes_exactly_the_fields_its_fix_names():
    for specialist, fix_id, fields, where in _calls():
        wanted = advice.placeholders(specialist, fix_id)
        assert fields == wanted, f"{where}: advice.fix({specialist!r}, {fix_id!r}) passes {sorted(fields)}, the text names {sorted(wanted)}"


def test_a_template_is_filled_and_a_plain_fix_keeps_its_braces(monkeypatch):
    data = {"snippet": {"t": {}}, "t": {
        "templated": {"template": True, "title": "Lower the batch to {batch}", "why": "peak {peak_gib:.1f} GiB", "verify": "fits",
                      "snippet": "cfg = {{'batch': {batch}}}"},
        "plain": {"title": "Use a dict", "why": "w", "verify": "v", "snippet": "cfg = {'a': 1}"}}}
    monkeypatch.setattr(advice, "table", lambda: data)
    assert advice.placeholders("t", "templated") == {"batch", "peak_gib"}
    fix = advice.fix("t", "templated", batch=8, peak_gib=9.25)
    assert (fix.title, fix.why, fix.snippet) == ("Lower the batch to 8", "peak 9.2 GiB", "cfg = {'batch': 8}")
    assert advice.fix("t", "plain").snippet == "cfg = {'a': 1}" and advice.placeholders("t", "plain") == set()


def test_every_fix_the_code_names_is_in_the_data_and_every_fix_there_is_named():
    named = _named_in_code()
    written = {(s, f) for s in MOVED for f in advice.fixes(s)}
    assert named and named == written, (sorted(named - written), sorted(written - named))


def test_every_fix_has_its_fields_and_its_snippet_resolves():
    for specialist in MOVED:
        for fix_id, row in advice.fixes(specialist).items():
            assert set(row) <= set(advice.FIELDS), (fix_id, set(row) - set(advice.FIELDS))
            assert all(row.get(k) for k in advice.REQUIRED), fix_id
            assert not ("snippet" in row and "snippet_name" in row), fix_id
            fix = advice.fix(specialist, fix_id, **dict.fromkeys(advice.placeholders(specialist, fix_id), 1))
            assert fix.snippet or "snippet" not in row and "snippet_name" not in row


def test_a_moved_specialist_keeps_no_fix_literal():
    for specialist in MOVED:
        module = specialists.MODULES.get(specialist, specialist)  # module-design lives in module_design.py
        package = SPECIALISTS / module  # a specialist split into a package (debugging/)
        for path in sorted(package.glob("*.py")) if package.is_dir() else [SPECIALISTS / f"{module}.py"]:
            tree = ast.parse(path.read_text())
            literals = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Fix"]
            assert not literals, f"{path.name} still writes Fix(...) at lines {literals}"


def test_the_evidence_still_decides_which_fixes_and_where():
    ev = Evidence(kind="error", summary="wrong count", values={"expected": 2, "got": 1}, source="wrong-number-of-gradients")
    symptom = catalog.make_symptom("bad-custom-backward", evidence=[ev])
    report = specialists.consult("autograd", [symptom])
    assert report.fixes[0].title == "Return exactly one gradient per forward input"  # the count is what is wrong
    measured = catalog.make_symptom("bad-custom-backward", evidence=[Evidence(kind="probe", summary="gradcheck",
                                                                              values={"max_abs_error": 0.5},
                                                                              source="gradcheck")])
    report = specialists.consult("autograd", [measured])
    assert report.fixes[0].title.startswith("Derive each gradient") and "gradcheck(" in report.fixes[0].snippet

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


def _named_in_code() -> set[tuple[str, str]]:
    named = set()
    for path in SPECIALISTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fix"
                    and getattr(node.func.value, "id", None) == "advice"):
                specialist, fix_id = (a.value for a in node.args[:2])  # type: ignore[attr-defined]
                named.add((specialist, fix_id))
    return named


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
            fix = advice.fix(specialist, fix_id)
            assert fix.snippet or "snippet" not in row and "snippet_name" not in row


def test_a_moved_specialist_keeps_no_fix_literal():
    for specialist in MOVED:
        package = SPECIALISTS / specialist  # a specialist split into a package (debugging/)
        for path in sorted(package.glob("*.py")) if package.is_dir() else [SPECIALISTS / f"{specialist}.py"]:
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

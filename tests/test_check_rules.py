"""Every static rule, table-driven: metadata, fixtures that must fire (on the marked lines),
near misses that must not, the docs' own bad/good examples, and healthy scripts that stay clean.

Adding a rule = the check + its TOML docs + tests/fixtures/check/rules/TDxxx/{fire,ok}*.py;
nothing in this file changes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from torchdoctor.rules import catalog
from torchdoctor.rules.static import registry
from torchdoctor.rules.static.engine import analyse_text

RULES_DIR = FIXTURES / "check" / "rules"
HEALTHY_DIR = FIXTURES / "check" / "healthy"
EXPECT = re.compile(r"#\s*expect:\s*(TD\d{3}(?:\s*,\s*TD\d{3})*)")
ALL = registry.rules()
CODES = [code for code in ALL if code != "TD000"]


def _fixtures(prefix: str) -> list[Path]:
    return sorted(RULES_DIR.glob(f"TD*/{prefix}*.py"))


def expected_lines(text: str, code: str) -> list[int]:
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        m = EXPECT.search(line)
        if m and code in [c.strip() for c in m.group(1).split(",")]:
            lines.append(number)
    return lines


def lines_found(text: str, path: Path, code: str) -> list[int]:
    result = analyse_text(text, str(path))
    stopped = [r.finding.message for r in result.results if r.finding.code == "TD000"]
    assert not stopped, stopped
    return sorted(r.finding.line for r in result.results if r.finding.code == code)


def test_there_are_enough_rules_and_each_has_its_fixtures():
    assert len(CODES) >= 14
    for code in CODES:
        fire, ok = sorted((RULES_DIR / code).glob("fire*.py")), sorted((RULES_DIR / code).glob("ok*.py"))
        assert fire and ok, f"{code} needs fire*.py and ok*.py in {RULES_DIR / code}"
        assert any(expected_lines(f.read_text(), code) for f in fire), f"{code}: no `# expect: {code}` marker"
    stray = {d.name for d in RULES_DIR.iterdir() if d.is_dir()} - set(CODES)
    assert not stray, f"fixture folders without a rule: {sorted(stray)}"


def test_readme_counts_of_rules_match_the_catalogue():
    # The README states how many rules there are and how many report at info; both went stale before.
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    docs = [r.doc for r in registry.rules().values() if r.doc.code != "TD000"]
    at_info = sum(1 for d in docs if d.level == "info")
    assert f"There are {len(docs)} rules plus `TD000`" in readme
    assert f"{at_info} of the {len(docs)} rules report at `info`" in readme


@pytest.mark.parametrize("path", _fixtures("fire"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_rule_fires_on_the_marked_lines(path):
    code = path.parent.name
    text = path.read_text()
    assert lines_found(text, path, code) == expected_lines(text, code)


@pytest.mark.parametrize("path", _fixtures("ok"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_rule_stays_quiet_on_its_near_miss(path):
    code = path.parent.name
    assert lines_found(path.read_text(), path, code) == []


@pytest.mark.parametrize("code", CODES)
def test_docs_examples_bad_fires_and_good_does_not(code):
    doc = ALL[code].doc
    bad = analyse_text(doc.bad, f"{code}-bad.py")
    good = analyse_text(doc.good, f"{code}-good.py")
    assert [r for r in bad.results if r.finding.code == code], f"{code}'s bad example does not fire"
    assert not [r for r in good.results if r.finding.code == code], f"{code}'s good example fires"
    assert not [r for r in bad.results + good.results if r.finding.code == "TD000"]


def test_td000_docs_examples():
    doc = ALL["TD000"].doc
    assert [r.finding.code for r in analyse_text(doc.bad).results] == ["TD000"]
    assert analyse_text(doc.good, codes=[]).results == []


@pytest.mark.parametrize("code", list(ALL))
def test_rule_metadata(code):
    doc = ALL[code].doc
    assert re.fullmatch(r"TD\d{3}", doc.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", doc.name)
    assert doc.severity in ("error", "warning", "info")
    info = catalog.symptom(doc.symptom)
    assert doc.specialist in info.route, f"{code}: {doc.specialist} is not on {doc.symptom}'s route {info.route}"
    if code != "TD000":
        assert doc.specialist == registry.SPECIALIST_BY_DIGIT[code[2]]
        assert ALL[code].check is not None and ALL[code].nodes
    for field in ("summary", "message", "fix", "why", "bad", "good"):
        assert getattr(doc, field).strip(), f"{code}: empty {field}"
    # A message names what it is about: every rule's message has at least one field to fill.
    assert "{" in doc.message, f"{code}: the message names no variable or call"


def test_rule_names_are_unique():
    names = [r.name for r in ALL.values()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("path", sorted(HEALTHY_DIR.glob("*.py")), ids=lambda p: p.name)
def test_healthy_scripts_have_no_warnings_or_errors(path):
    result = analyse_text(path.read_text(), str(path))
    noisy = [
        f"{r.finding.code} line {r.finding.line}: {r.finding.message}"
        for r in result.results
        if r.finding.severity in ("error", "warning")
    ]
    assert not noisy, "\n".join(noisy)
    assert result.analysed


def test_healthy_scripts_cover_the_setups_the_rules_must_understand():
    names = {p.name for p in HEALTHY_DIR.glob("*.py")}
    assert {"nanogpt_ddp.py", "single_gpu.py", "lightning_module.py", "hf_trainer.py"} <= names
    contexts = analyse_text((HEALTHY_DIR / "nanogpt_ddp.py").read_text()).contexts
    assert {"distributed", "amp", "compile", "gpu"} <= contexts


def test_version_aware_rule_follows_the_targeted_torch():
    text = ALL["TD206"].doc.bad
    assert [r.finding.code for r in analyse_text(text, codes=["TD206"], torch_version=(2, 4)).results] == ["TD206"]
    assert analyse_text(text, codes=["TD206"], torch_version=(1, 13)).results == []


def test_inline_suppressions():
    base = ALL["TD202"].doc.bad
    line = "logits = model.forward(x)"
    for comment, fires in [
        ("  # torchdoctor: ignore[TD202]", False),
        ("  # torchdoctor: ignore[TD2]", False),
        ("  # torchdoctor: ignore[TD101, TD202]", False),
        ("  # torchdoctor: ignore", False),
        ("  # torchdoctor: ignore[TD101]", True),
        ("  # noqa", True),
    ]:
        text = base.replace(line, line + comment)
        found = [r.finding.code for r in analyse_text(text, codes=["TD202"]).results]
        assert (found == ["TD202"]) is fires, (comment, found)


def test_findings_carry_positions_frames_and_values():
    result = analyse_text(ALL["TD101"].doc.bad, "train.py", codes=["TD101"])
    (r,) = result.results
    f = r.finding
    assert (f.line, f.col, f.end_line) == (15, 5, 15)
    assert f.end_col == 23 and f.path == "train.py"
    assert r.code == "total_loss += loss" and r.values["variable"] == "total_loss"
    assert f.frame["first_line"] == 13 and f.frame["lines"][2] == "    total_loss += loss"
    assert "`total_loss`" in f.message and "in `total_loss` instead of `loss`" in f.fix


def test_columns_count_characters_not_bytes():
    text = 'import torch\nmodel = torch.nn.Linear(2, 2)\nétiquette = "é"; y = model.forward(torch.ones(2))\n'
    (r,) = analyse_text(text, codes=["TD202"]).results
    assert r.finding.col == len('étiquette = "é"; y = ') + 1


NARROWED = [code for code in CODES if ALL[code].callees or ALL[code].methods]


@pytest.mark.parametrize("code", NARROWED)
def test_a_rule_narrowed_to_some_calls_finds_what_it_finds_on_every_call(code, monkeypatch):
    """`callees=`/`methods=` on `@rule` is a promise that the check does nothing for any other call: the same
    findings, in the same order, with the check called on every call of the file."""
    import dataclasses

    sources = [(p, p.read_text()) for p in sorted((RULES_DIR / code).glob("*.py"))]
    sources += [(Path(f"{code}-bad.py"), ALL[code].doc.bad), (Path(f"{code}-good.py"), ALL[code].doc.good)]
    narrowed = [[(r.finding.line, r.finding.col, r.finding.message) for r in analyse_text(text, str(path), [code]).results]
                for path, text in sources]
    monkeypatch.setitem(ALL, code, dataclasses.replace(ALL[code], callees=(), methods=()))
    every = [[(r.finding.line, r.finding.col, r.finding.message) for r in analyse_text(text, str(path), [code]).results]
             for path, text in sources]
    assert narrowed == every and any(narrowed)


NARROWED_BY_OPERATOR = [code for code in CODES if ALL[code].ops]


@pytest.mark.parametrize("code", NARROWED_BY_OPERATOR)
def test_a_rule_narrowed_to_some_operators_finds_what_it_finds_on_every_binop(code, monkeypatch):
    """`ops=` on `@rule` is the same promise for arithmetic: the check does nothing for a BinOp of another
    operator, so handing it every BinOp of the file changes nothing."""
    import dataclasses

    sources = [(p, p.read_text()) for p in sorted((RULES_DIR / code).glob("*.py"))]
    sources += [(Path(f"{code}-bad.py"), ALL[code].doc.bad), (Path(f"{code}-good.py"), ALL[code].doc.good)]
    narrowed = [[(r.finding.line, r.finding.col, r.finding.message) for r in analyse_text(text, str(path), [code]).results]
                for path, text in sources]
    monkeypatch.setitem(ALL, code, dataclasses.replace(ALL[code], ops=()))
    every = [[(r.finding.line, r.finding.col, r.finding.message) for r in analyse_text(text, str(path), [code]).results]
             for path, text in sources]
    assert narrowed == every and any(narrowed)


def test_operators_narrow_only_a_binop_subscription():
    from torchdoctor.rules.static.api import rule

    with pytest.raises(TypeError):
        rule("TD999", ast.Call, ops=(ast.Div,))
    with pytest.raises(TypeError):
        rule("TD999", ast.BinOp, ops=(ast.Name,))


def test_binops_of_several_operators_come_in_the_walk_order():
    from torchdoctor.rules.static.engine import _wanted, walk
    from torchdoctor.rules.static.index import Index

    text = "a = x / y\nb = (p @ q) / (r - s @ t)\nc = u + v\n"
    tree = ast.parse(text)
    buckets, parents = walk(tree, _wanted([]) | {ast.BinOp})
    index = Index(tree, buckets, parents, text)
    shown = [ast.unparse(n) for n in index.binops((ast.MatMult, ast.Div))]
    assert shown == ["x / y", "p @ q / (r - s @ t)", "p @ q", "s @ t"]
    assert [ast.unparse(n) for n in index.binops((ast.Add,))] == ["u + v"] and index.binops((ast.Mod,)) == []

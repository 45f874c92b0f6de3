"""Declared evidence (rules/data/evidence.toml) held against its producers and its readers.

Producers: error signatures (their named groups), static rules (their message and fix fields, and
what they report on their fixtures), probes (what their analysis emits on recorded and live runs).
Readers: the specialists, which look values up by key.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

from tests import doors
from torchdoctor.rules import evidence
from torchdoctor.rules.evidence import EvidenceError

ROOT = Path(__file__).resolve().parents[1]
SPECIALISTS = ROOT / "specialists"
ACCESSORS = {"num", "text", "names", "dims", "value", "_flag"}  # Case's readers, and memory's yes/no one


def _problems(reports) -> list[str]:
    found = []
    for name, report in reports:
        found += [f"{name}: {p}" for p in evidence.report_problems(report.symptoms)]
    return found


# -- the registry itself ---------------------------------------------------------------------------


def test_every_key_has_a_known_type_a_unit_when_numeric_and_a_producer():
    keys = evidence.keys()  # raises on a bad row
    assert len(keys) > 300
    numeric = [k for k in keys.values() if k.type in evidence.NUMERIC]
    assert numeric and all(k.unit in evidence.units() for k in numeric)


def test_a_bad_row_is_refused(monkeypatch):
    from torchdoctor.rules import catalog

    table = {"units": {"ms": "milliseconds"}, "key": {"wait": {"type": "float", "by": ["probe:data"]}}}
    monkeypatch.setattr(catalog, "load_toml", lambda name: table)
    evidence.keys.cache_clear()
    evidence.units.cache_clear()
    try:
        with pytest.raises(EvidenceError, match="needs a unit"):
            evidence.keys()
    finally:
        evidence.keys.cache_clear()
        evidence.units.cache_clear()


def test_values_are_checked_for_type_key_and_producer():
    assert evidence.problems("probe", "memory", {"peak_gib": 1.5, "step": 3}) == []
    assert evidence.problems("error", "cuda-oom", {"requested_gib": 0.5}) == []
    [wrong_type] = evidence.problems("probe", "memory", {"peak_gib": "1.5"})
    assert "declared float" in wrong_type
    [undeclared] = evidence.problems("probe", "memory", {"peak_gb": 1.5})
    assert "does not declare" in undeclared
    [stranger] = evidence.problems("static", "TD101", {"peak_gib": 1.5})
    assert "names only" in stranger


# -- producers: what they can emit -----------------------------------------------------------------


def _signatures() -> list[dict]:
    with open(ROOT / "rules" / "data" / "signatures.toml", "rb") as fh:
        return tomllib.load(fh)["signature"]


_UNIT_NAMES = {"size": "{}_gib", "bytes": "{}_gib"}
_UNIT_TYPES = {"size": "float", "bytes": "float", "int": "int", "float": "float", "shape": "list[int]",
               "ints": "list[int]", "keys": "list[str]", "names": "list[str]"}


def test_every_signature_group_is_a_declared_key_of_its_type():
    keys = evidence.keys()
    wrong = []
    for sig in _signatures():
        for group in re.findall(r"\(\?P<(\w+)>", sig["pattern"]):
            unit = sig.get("units", {}).get(group)
            name = _UNIT_NAMES.get(unit, "{}").format(group)
            key = keys.get(name)
            if name in ("location", "detail", "device_a", "device_b", "device_a2", "device_b2"):
                continue  # consumed by the signature's derive step, never emitted as they are
            if key is None or not evidence.declares(key, "error", sig["id"]):
                wrong.append(f"{sig['id']}: {name} is not declared for error:{sig['id']}")
            elif key.type != _UNIT_TYPES.get(unit, "str") and not (key.type == "float" and unit == "int"):
                wrong.append(f"{sig['id']}: {name} is {_UNIT_TYPES.get(unit, 'str')}, declared {key.type}")
    assert not wrong, "\n".join(wrong)


def test_every_rule_template_field_is_declared_for_that_rule():
    from torchdoctor.rules.static import registry

    wrong = []
    for rule in registry.rules().values():  # under TORCHDOCTOR_CHECK_EVIDENCE=1 the rules' load checks this too
        try:
            registry._validate_fields(rule.doc)
        except registry.RuleError as exc:
            wrong.append(str(exc))
    assert not wrong, "\n".join(wrong)


def test_a_template_typo_fails_when_the_rules_load():
    from dataclasses import replace

    from torchdoctor.rules.static import registry

    doc = registry.get("TD101").doc
    with pytest.raises(registry.RuleError, match="not a declared evidence key"):
        registry._validate_fields(replace(doc, message=doc.message + " {varaible}"))
    with pytest.raises(registry.RuleError, match="does not name static:TD101"):
        registry._validate_fields(replace(doc, fix="{stepping_optimizer}"))


def test_ask_emits_only_declared_values_of_their_type():
    assert not _problems(doors.ask_reports())


def test_check_emits_only_declared_values_of_their_type():
    assert not _problems(doors.check_reports())


def test_recorded_runs_emit_only_declared_values_of_their_type():
    assert not _problems(doors.recorded_run_reports())


# -- readers: what the specialists look up --------------------------------------------------------


def _keys_read() -> dict[str, list[str]]:
    """Every literal key passed to a Case reader in specialists/*.py -> where."""
    read: dict[str, list[str]] = {}
    for path in sorted(SPECIALISTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name not in ACCESSORS:
                continue
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    read.setdefault(arg.value, []).append(f"{path.name}:{node.lineno}")
    return read


def test_every_key_a_specialist_reads_is_declared_with_a_producer():
    read = _keys_read()
    assert len(read) > 150  # the scan finds the readers
    keys = evidence.keys()
    orphans = {k: where for k, where in read.items() if k not in keys or not keys[k].producers}
    assert not orphans, orphans


def test_reading_an_undeclared_key_fails_in_debug_mode(monkeypatch):
    from torchdoctor.model import Symptom
    from torchdoctor.specialists.base import Case

    case = Case(Symptom("oom"), frozenset(), "ask", None)
    monkeypatch.setenv(evidence.CHECK_ENV, "1")
    assert case.num("requested_gib") is None
    with pytest.raises(EvidenceError, match="optimizer_gib"):
        case.num("optimizer_gib")
    monkeypatch.delenv(evidence.CHECK_ENV)
    assert case.num("optimizer_gib") is None  # outside debug mode a user's run never fails on it


def test_debug_mode_fails_a_report_with_undeclared_evidence(monkeypatch):
    from torchdoctor.diagnosis import diagnose
    from torchdoctor.model import Evidence, Report
    from torchdoctor.rules import catalog

    bad = catalog.make_symptom("high-memory", evidence=[Evidence("probe", "measured", values={"peak_gb": 3.0},
                                                                 source="memory")])
    monkeypatch.setenv(evidence.CHECK_ENV, "1")
    with pytest.raises(EvidenceError, match="peak_gb"):
        diagnose(Report(command="run", symptoms=[bad]))

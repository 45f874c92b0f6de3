"""The declared evidence keys: what a producer may put in `Evidence.values`, of which type and unit.

Specialists read evidence by key (`case.num("peak_gib")`); probes, static rules
and error signatures write it. `data/evidence.toml` is the one list both sides
are checked against: every key with its type, its unit when it is a number, and
the producers that emit it (`probe:<probe>`, `static:<rule code>`,
`error:<signature id>`; `static:*` / `error:*` for a key the door adds to every
piece of evidence it makes).

Why one data file next to the catalogue rather than declarations in each
producer's code: the producers are of three kinds and two of them are already
data (signatures, rule docs); the readers are the eight specialists. One table
lets a test hold both sides against it without importing torch or the probes,
shows at a glance when two producers use one name for two things (the reason
`line` was text from a rule and a number from a signature), and keeps the
registry loadable by `ask` and `check`, which must start fast.

Checked by tests/test_evidence.py: every value a producer emits on the fixtures
of every door is declared, of its type, from a declared producer; every key a
specialist reads is declared and has a producer; every rule template field and
every signature group is a declared key. `TORCHDOCTOR_CHECK_EVIDENCE=1` makes
`diagnose()` check each report it builds the same way and fail loudly (for
debugging a new producer on a real script).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

TYPES = ("int", "float", "bool", "str", "list[str]", "list[int]", "list[float]", "list[dict]", "list[list[int]]")
NUMERIC = ("int", "float", "list[int]", "list[float]", "list[list[int]]")
PRODUCER_KINDS = ("probe", "static", "error")
CHECK_ENV = "TORCHDOCTOR_CHECK_EVIDENCE"  # set: diagnose() and Case.value() check against the registry


class EvidenceError(ValueError):
    """A producer emitted a value the registry does not declare, or not of its declared type."""


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    unit: str | None  # numbers only: GiB, ms, count, fraction, ...
    producers: tuple[str, ...]  # "probe:memory", "static:TD101", "error:cuda-oom", "static:*"
    doc: str = ""


@cache
def units() -> dict[str, str]:
    """The allowed units and what each means."""
    from torchdoctor.rules.catalog import load_toml

    return dict(load_toml("evidence.toml")["units"])


@cache
def keys() -> dict[str, Key]:
    """Every declared key, checked for a known type, a unit on numbers, and well-formed producers."""
    from torchdoctor.rules.catalog import load_toml

    table = load_toml("evidence.toml")["key"]
    allowed_units = units()
    out: dict[str, Key] = {}
    for name, row in table.items():
        key = Key(name, row["type"], row.get("unit"), tuple(row["by"]), row.get("doc", ""))
        if key.type not in TYPES:
            raise EvidenceError(f"evidence key {name!r}: type {key.type!r} is not one of {TYPES}")
        if key.type in NUMERIC and key.unit not in allowed_units:
            raise EvidenceError(f"evidence key {name!r}: a number needs a unit from [units], not {key.unit!r}")
        if key.type not in NUMERIC and key.unit is not None:
            raise EvidenceError(f"evidence key {name!r}: only numbers carry a unit")
        if not key.producers:
            raise EvidenceError(f"evidence key {name!r}: no producer")
        for producer in key.producers:
            kind, _, source = producer.partition(":")
            if kind not in PRODUCER_KINDS or not source:
                raise EvidenceError(f"evidence key {name!r}: producer {producer!r} is not kind:source")
        out[name] = key
    return out


def of_type(value: Any, type_name: str) -> bool:
    """Whether a value fits a declared type (an int fits `float`; JSON has one number type)."""
    if type_name == "bool":
        return isinstance(value, bool)
    if type_name == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_name == "str":
        return isinstance(value, str)
    if type_name == "dict":
        return isinstance(value, dict)
    if type_name.startswith("list["):
        inner = type_name[5:-1]
        return isinstance(value, (list, tuple)) and all(of_type(v, inner) for v in value)
    return False


def declares(key: Key, kind: str, source: str | None) -> bool:
    return f"{kind}:{source}" in key.producers or f"{kind}:*" in key.producers


def problems(kind: str, source: str | None, values: Mapping[str, Any]) -> list[str]:
    """What is wrong with one piece of evidence's values: undeclared keys, wrong types, undeclared producers.

    `text` evidence (the user's words) carries no values; a None value means "not measured" and passes.
    """
    found: list[str] = []
    declared = keys()
    for name, value in values.items():
        key = declared.get(name)
        if key is None:
            found.append(f"{kind}:{source} emits {name!r}, which rules/data/evidence.toml does not declare")
            continue
        if value is not None and not of_type(value, key.type):
            found.append(f"{kind}:{source} emits {name}={value!r}, declared {key.type}")
        if not declares(key, kind, source):
            found.append(f"{kind}:{source} emits {name!r}, but evidence.toml names only {', '.join(key.producers)}")
    return found


def report_problems(symptoms: Iterable[Any]) -> list[str]:
    """Every problem of every piece of evidence of these symptoms (duplicates once)."""
    found: list[str] = []
    for s in symptoms:
        for ev in s.evidence:
            for p in problems(ev.kind, ev.source, ev.values):
                if p not in found:
                    found.append(p)
    return found


def require_declared(name: str) -> None:
    """Debug mode: a specialist reading a key nobody declares (a typo, an alias with no producer) fails."""
    if name not in keys():
        raise EvidenceError(f"a specialist reads {name!r}, which rules/data/evidence.toml does not declare")


def template_fields(template: str) -> set[str]:
    """The field names a format template uses: '{variable}' and '{count:.0f}' give variable, count."""
    names = set()
    for _, field, _, _ in string.Formatter().parse(template):
        if field:
            names.add(field.split(".")[0].split("[")[0])
    return names

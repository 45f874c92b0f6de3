"""Whether a report contradicts its own numbers: specialists' wording checked against the measurements.

The checks are data (`rules/data/contradictions.toml`): a measurement (a symptom
present, an evidence value above a number, equal to or matching a text) and
the wording that must not appear beside it. This module only evaluates them,
on a Report's JSON form, so a recorded `report.json` is checked the same way as
a report built in this process. Whether the fixes fit the training framework the
report found (Lightning, the Trainer, Accelerate) is checked against
rules/data/frameworks.toml too (`framework_misfits`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class Contradiction:
    id: str
    why: str
    measured: dict[str, Any]
    says: re.Pattern[str]
    where: str  # advice | all


@dataclass(frozen=True)
class Found:
    """One contradiction in one report: which check, which specialist, the words that broke it."""

    check: str
    specialist: str
    words: str

    def __str__(self) -> str:
        return f"{self.check}: {self.specialist} says {self.words!r}"


_CONDITIONS = {"symptom", "key", "above", "equals", "matches", "not_matches", "context", "not_context"}


@cache
def checks() -> tuple[Contradiction, ...]:
    from torchdoctor.rules.catalog import load_toml

    out = []
    for row in load_toml("contradictions.toml")["contradiction"]:
        measured = dict(row.get("measured", {}))
        unknown = set(measured) - _CONDITIONS
        if unknown:
            raise ValueError(f"contradiction {row['id']}: unknown condition(s) {sorted(unknown)}")
        if set(measured) & {"above", "equals", "matches", "not_matches"} and "key" not in measured:
            raise ValueError(f"contradiction {row['id']}: a value condition needs `key`")
        if not isinstance(measured.get("not_context", []), list):
            raise ValueError(f"contradiction {row['id']}: not_context is a list of contexts")
        where = row.get("where", "advice")
        if where not in ("advice", "all"):
            raise ValueError(f"contradiction {row['id']}: where must be advice or all")
        out.append(Contradiction(row["id"], row["why"], measured, re.compile(row["says"], re.IGNORECASE), where))
    return tuple(out)


def _values(report: dict[str, Any], key: str) -> Iterator[Any]:
    """Every value named `key`: in any symptom's evidence, and among the run's measurements."""
    for numbers in ((report.get("run") or {}).get("measurements") or {}).values():
        if isinstance(numbers, dict) and numbers.get(key) is not None:
            yield numbers[key]
    for symptom in report.get("symptoms") or []:
        for ev in symptom.get("evidence") or []:
            values = ev.get("values") or {}
            if key in values and values[key] is not None:
                yield values[key]


def _value_holds(value: Any, m: dict[str, Any]) -> bool:
    if "above" in m and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > m["above"]):
        return False
    if "equals" in m and value != m["equals"]:
        return False
    if "matches" in m and not (isinstance(value, str) and re.search(m["matches"], value)):
        return False
    if "not_matches" in m and not (isinstance(value, str) and not re.search(m["not_matches"], value)):
        return False
    return True


def measured(report: dict[str, Any], m: dict[str, Any]) -> bool:
    """Whether the report holds the measurement `m` (every condition)."""
    if "symptom" in m:
        ids = {s.get("id") for s in report.get("symptoms") or []}
        if not ids & set(m["symptom"]):
            return False
    contexts = report.get("contexts") or []
    if "context" in m and m["context"] not in contexts:
        return False
    if "not_context" in m and set(m["not_context"]) & set(contexts):
        return False
    if "key" in m:
        return any(_value_holds(v, m) for v in _values(report, m["key"]))
    return True


def _advice_texts(fix_report: dict[str, Any]) -> Iterator[str]:
    yield fix_report.get("diagnosis") or ""
    for fix in fix_report.get("fixes") or []:
        for part in ("title", "snippet", "why", "verify", "applies_when"):
            if fix.get(part):
                yield fix[part]
    yield from fix_report.get("next_steps") or []


def _other_texts(report: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for fix_report in report.get("reports") or []:
        for line in fix_report.get("evidence") or []:
            yield fix_report.get("specialist", ""), line
    run = report.get("run") or {}
    for probe, numbers in (run.get("measurements") or {}).items():
        for value in (numbers or {}).values():
            if isinstance(value, str):
                yield f"measurements.{probe}", value


def contradictions(report: dict[str, Any]) -> list[Found]:
    """Every contradiction between a report's wording and its own measurements (a Report's to_dict())."""
    found: list[Found] = []
    for check in checks():
        if not measured(report, check.measured):
            continue
        texts = [(r.get("specialist", ""), t) for r in report.get("reports") or [] for t in _advice_texts(r)]
        if check.where == "all":
            texts += list(_other_texts(report))
        for specialist, text in texts:
            m = check.says.search(text)
            if m:
                found.append(Found(check.id, specialist, m.group(0)))
    return found + framework_misfits(report)


FRAMEWORK_FORM = "training with "  # how specialists/frameworks.py marks a framework's form of a fix


def framework_misfits(report: dict[str, Any]) -> list[Found]:
    """Advice that does not fit the framework the report measured (rules/data/frameworks.toml).

    Two checks, in code because they read the order of the fixes rather than their words:
    `framework-form-missing`, a plain-PyTorch fix for a change the framework makes with its own
    setting (a GradScaler under Lightning's precision=) with no framework form of that change before it in
    the same fix report; `other-framework-form`, the form of a framework the report did not find.
    """
    from torchdoctor.specialists.frameworks import framework_of, table

    framework = framework_of(report.get("contexts") or [])
    found: list[Found] = []
    for fix_report in report.get("reports") or []:
        specialist = fix_report.get("specialist", "")
        given: set[str] = set()  # the titles of the framework forms given so far in this fix report
        for fix in fix_report.get("fixes") or []:
            title = fix.get("title") or ""
            when = fix.get("applies_when") or ""
            if when.startswith(FRAMEWORK_FORM):
                if framework is None or when.removeprefix(FRAMEWORK_FORM) != framework["label"]:
                    found.append(Found("other-framework-form", specialist, title))
                given.add(title)
                continue
            if framework is None:
                continue
            text = f"{title}\n{fix.get('snippet') or ''}"
            forms = {f"{framework['label']}: {knob[framework['id']]['title']}" for knob in table().get("knob", [])
                     if framework["id"] in knob and any(m in text for m in knob["matches"])}
            if forms and not forms & given:
                found.append(Found("framework-form-missing", specialist, title))
    return found

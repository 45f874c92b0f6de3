"""Every rule, with its documentation: family modules in `rules/` paired with their TOML files.

A family is `rules/<family>.py` (the checks, registered with `@rule`) plus
`rules/<family>.toml` (one `[[rule]]` table per code: name, severity, symptom,
summary, message, fix, why, bad, good). Families are discovered, not listed,
so adding one touches no shared file.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from torchdoctor.rules import evidence
from torchdoctor.rules.static.api import REGISTERED, SEVERITIES, Rule, RuleDoc

FAMILIES = "torchdoctor.rules.static.rules"
BUILTIN = Path(__file__).with_name("builtin.toml")  # TD000, raised by the engine itself
CODE = re.compile(r"^TD\d{3}$")
SPECIALIST_BY_DIGIT = {
    "1": "memory",
    "2": "module-design",
    "3": "distributed",
    "4": "mixed-precision",
    "5": "profiling",
    "6": "debugging",
    "7": "checkpointing",
    "8": "autograd",
}
DOC_FIELDS = ("code", "name", "severity", "symptom", "summary", "message", "fix", "why", "bad", "good")


class RuleError(Exception):
    """A rule family that does not follow the conventions (a bug in torchdoctor, caught by tests)."""


def _load_docs(path: Path) -> list[RuleDoc]:
    import tomllib

    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    specialist = data.get("specialist")
    docs = []
    for row in data.get("rule", []):
        missing = [f for f in DOC_FIELDS if not isinstance(row.get(f), str) or not row[f].strip()]
        if missing:
            raise RuleError(f"{path.name}: rule {row.get('code', '?')} lacks {', '.join(missing)}")
        extra = set(row) - set(DOC_FIELDS) - {"calibrated"}
        if extra:
            raise RuleError(f"{path.name}: rule {row['code']} has unknown fields {sorted(extra)}")
        docs.append(
            RuleDoc(
                **{f: row[f].strip("\n") if f in ("bad", "good") else row[f].strip() for f in DOC_FIELDS},
                specialist=specialist or "",
                family=path.stem,
                calibrated=str(row.get("calibrated", "")).strip(),
            )
        )
    return docs


@cache
def rules() -> dict[str, Rule]:
    """Every rule by code, TD000 included, in code order."""
    package = importlib.import_module(FAMILIES)
    folder = Path(package.__file__).parent
    for info in sorted(pkgutil.iter_modules([str(folder)]), key=lambda m: m.name):
        importlib.import_module(f"{FAMILIES}.{info.name}")
    docs: dict[str, RuleDoc] = {}
    for path in [BUILTIN, *sorted(folder.glob("*.toml"))]:
        for doc in _load_docs(path):
            if doc.code in docs:
                raise RuleError(f"{doc.code} is documented twice ({docs[doc.code].family}, {doc.family})")
            docs[doc.code] = doc
    checks: dict[str, tuple] = {}
    for code, nodes, fn, module, reads, callees, methods, ops in REGISTERED:
        if code in checks and checks[code][1] is not fn:
            raise RuleError(f"{code} is registered twice")
        checks[code] = (nodes, fn, module, reads, callees, methods, ops)
    table: dict[str, Rule] = {}
    for code in sorted(docs):
        doc = docs[code]
        _validate(doc)
        if code == "TD000":
            table[code] = Rule(doc, None, ())
            continue
        if code not in checks:
            raise RuleError(f"{code} is documented in {doc.family}.toml but no @rule registers it")
        nodes, fn, module, reads, callees, methods, ops = checks[code]
        if module.rsplit(".", 1)[-1] != doc.family:
            raise RuleError(f"{code}: its check lives in {module} but its docs in {doc.family}.toml")
        table[code] = Rule(doc, fn, nodes, reads, callees, methods, ops)
    undocumented = sorted(set(checks) - set(docs))
    if undocumented:
        raise RuleError(f"rules without docs: {', '.join(undocumented)}")
    return table


def _validate(doc: RuleDoc) -> None:
    from torchdoctor.rules import catalog

    if not CODE.match(doc.code):
        raise RuleError(f"bad rule code {doc.code!r}: TD and three digits")
    if doc.severity not in SEVERITIES:
        raise RuleError(f"{doc.code}: severity {doc.severity!r} is not one of {SEVERITIES}")
    if doc.calibrated and (doc.calibrated not in SEVERITIES
                           or SEVERITIES.index(doc.calibrated) <= SEVERITIES.index(doc.severity)):
        raise RuleError(f"{doc.code}: calibrated {doc.calibrated!r} must be a severity below {doc.severity!r}")
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", doc.name):
        raise RuleError(f"{doc.code}: name {doc.name!r} is not kebab-case")
    catalog.symptom(doc.symptom)  # raises on an unknown id
    if os.environ.get(evidence.CHECK_ENV):  # tests/test_evidence.py checks every rule's fields in any case
        _validate_fields(doc)
    expected = SPECIALIST_BY_DIGIT.get(doc.code[2])
    if expected is not None and doc.specialist != expected:
        raise RuleError(f"{doc.code}: the hundreds digit names {expected}, its family file says {doc.specialist!r}")


def _validate_fields(doc: RuleDoc) -> None:
    """Every placeholder of the message and fix is an evidence key this rule is declared to emit
    (rules/data/evidence.toml): a typo fails here, when the rules load, not in a user's run."""
    declared = evidence.keys()
    for field in sorted(evidence.template_fields(doc.message) | evidence.template_fields(doc.fix)):
        key = declared.get(field)
        if key is None:
            raise RuleError(f"{doc.code}: template field {{{field}}} is not a declared evidence key (rules/data/evidence.toml)")
        if not evidence.declares(key, "static", doc.code):
            raise RuleError(f"{doc.code}: evidence.toml does not name static:{doc.code} as a producer of {field!r}")


def get(code: str) -> Rule | None:
    return rules().get(code.upper())


def by_name(name: str) -> Rule | None:
    for r in rules().values():
        if r.name == name:
            return r
    return None


def normalise_selector(selector: str) -> str:
    selector = selector.strip().upper()
    return "TD" if selector == "ALL" else selector


def unknown_selectors(selectors: Iterable[str]) -> list[str]:
    """Codes or prefixes that match no rule (usage errors)."""
    codes = list(rules())
    return [s for s in selectors if not any(c.startswith(normalise_selector(s)) for c in codes)]


def is_enabled(code: str, select: Iterable[str], ignore: Iterable[str]) -> bool:
    """The most specific matching prefix decides; on a tie, ignore wins (like ruff)."""
    best_select = max((len(p) for p in map(normalise_selector, select) if code.startswith(p)), default=-1)
    best_ignore = max((len(p) for p in map(normalise_selector, ignore) if code.startswith(p)), default=-1)
    return best_select >= 0 and best_select > best_ignore


def selected(select: Iterable[str], ignore: Iterable[str]) -> list[Rule]:
    """Enabled rules. TD000 (could not analyse) stays on whatever `select` says, like a syntax
    error in ruff: only an `ignore` entry that matches it turns it off."""
    select, ignore = list(select), list(ignore)
    return [
        r
        for code, r in rules().items()
        if is_enabled(code, select, ignore)
        or (code == "TD000" and not any(code.startswith(normalise_selector(p)) for p in ignore))
    ]

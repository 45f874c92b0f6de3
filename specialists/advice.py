"""Constant advice as data: the fixes of rules/data/advice/<specialist>.toml, built into `Fix` objects.

A fix whose title, snippet, why and verify do not depend on the evidence is data; the specialist's
code decides which fixes apply, in which order, and which line each is pinned to. One specialist
per file, so specialists move (and are edited) independently; those not moved yet keep their Fix
literals until they do.
"""

from __future__ import annotations

import string
from functools import cache
from typing import Any

from torchdoctor.model import Fix, Location

REQUIRED = ("title", "why", "verify")
FIELDS = (*REQUIRED, "snippet", "snippet_name", "applies_when", "template")


def files() -> list[str]:
    """The advice files, relative to rules/data, in a fixed order."""
    from torchdoctor.rules.catalog import DATA

    return sorted(f"advice/{p.name}" for p in (DATA / "advice").glob("*.toml"))


@cache
def table() -> dict[str, Any]:
    """Every specialist's fixes, and [snippet.<specialist>] merged across the files."""
    from torchdoctor.rules.catalog import load_toml

    merged: dict[str, Any] = {"snippet": {}}
    for name in files():
        data = load_toml(name)
        merged["snippet"].update(data.get("snippet", {}))
        merged.update({k: v for k, v in data.items() if k != "snippet"})
    return merged


def fixes(specialist: str) -> dict[str, dict[str, Any]]:
    """Every fix of one specialist: id -> its fields, as written."""
    return {k: v for k, v in table().get(specialist, {}).items()}


def snippet(specialist: str, name: str) -> str:
    """A snippet several fixes (or a next step) of one specialist share."""
    return table()["snippet"][specialist][name]


TEMPLATED = ("title", "why", "verify", "snippet", "applies_when")


def placeholders(specialist: str, fix_id: str) -> set[str]:
    """The `{name}` fields a templated fix's text leaves to the evidence (its snippet included).

    Only a row with `template = true` is formatted (there `{{` is a brace); any other row is used as
    written, so the dict literals in its snippet need no escaping.
    """
    row = table()[specialist][fix_id]
    if not row.get("template"):
        return set()
    texts = [row.get(k) for k in TEMPLATED] + [snippet(specialist, row["snippet_name"]) if "snippet_name" in row else None]
    return {name for text in texts if text for _, name, _, _ in string.Formatter().parse(text) if name}


def fix(specialist: str, fix_id: str, location: Location | None = None, **fields: object) -> Fix:
    """The fix `fix_id` of `specialist`, pinned to `location` when the evidence names the user's line.

    A row marked `template = true` takes its `{name}` fields as keywords (the numbers and names the
    evidence gives); tests/test_advice.py checks that every call passes exactly the fields it names.
    """
    row = table()[specialist][fix_id]
    code = snippet(specialist, row["snippet_name"]) if "snippet_name" in row else row.get("snippet")
    texts = {"title": row["title"], "why": row["why"], "verify": row["verify"], "snippet": code,
             "applies_when": row.get("applies_when")}
    if row.get("template"):
        texts = {k: v.format(**fields) if v else v for k, v in texts.items()}
    return Fix(**texts, location=location)

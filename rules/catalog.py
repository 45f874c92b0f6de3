"""Loads the symptom catalogue and the routing table from `data/*.toml`.

The TOML files are the source of truth; this module only reads them (once per
process) and answers look-ups.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class SymptomInfo:
    id: str
    title: str
    route: tuple[str, ...]
    severity: str
    kind: str  # problem | topic


@cache
def load_toml(name: str) -> dict[str, Any]:
    """Parse `data/<name>`, once per process, through the precompiled cache (rules/cache.py)."""
    from torchdoctor.rules.cache import cached

    path = DATA / name

    def parse() -> dict[str, Any]:
        import tomllib

        with open(path, "rb") as fh:
            return tomllib.load(fh)

    return cached(name.replace("/", "."), [path], parse)  # the cache is one flat folder


@cache
def symptoms() -> dict[str, SymptomInfo]:
    rows = load_toml("symptoms.toml")["symptom"]
    return {
        r["id"]: SymptomInfo(r["id"], r["title"], tuple(r["route"]), r.get("severity", "warning"), r.get("kind", "problem"))
        for r in rows
    }


def symptom(symptom_id: str) -> SymptomInfo:
    try:
        return symptoms()[symptom_id]
    except KeyError:
        raise KeyError(f"unknown symptom id {symptom_id!r} (not in rules/data/symptoms.toml)") from None


def routing() -> dict[str, Any]:
    return load_toml("routing.toml")


@cache
def specialist_names() -> dict[str, str]:
    return {row["id"]: row["name"] for row in routing()["specialist"]}


def question(question_id: str) -> dict[str, Any]:
    for row in routing()["question"]:
        if row["id"] == question_id:
            return row
    raise KeyError(question_id)


def make_symptom(symptom_id: str, **fields: Any):  # -> torchdoctor.model.Symptom
    """A Symptom with its title, route and default severity filled from the catalogue."""
    from torchdoctor.model import Symptom

    info = symptom(symptom_id)
    fields.setdefault("severity", info.severity)
    return Symptom(
        id=symptom_id,
        title=info.title,
        specialist=info.route[0],
        specialists=list(info.route),
        **fields,
    )

"""Loads the symptom catalogue and the routing table from `data/*.toml`.

The TOML files are the source of truth; this module only reads them (once per
process) and answers look-ups.
"""

from __future__ import annotations

import marshal
import os
import sys
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
    """Parse `data/<name>`, through a marshal cache beside it (like a .pyc).

    tomllib is pure Python and parsing the triage data costs more than the
    rest of `torchdoctor ask`; the cache is keyed by the file's mtime and size,
    and, like bytecode, is not written under PYTHONDONTWRITEBYTECODE or where
    the package folder is read-only.
    """
    path = DATA / name
    st = path.stat()
    cache_dir = DATA / "__pycache__"
    cached = cache_dir / f"{name}.{st.st_mtime_ns}.{st.st_size}.marshal"
    try:
        return marshal.loads(cached.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        pass
    import tomllib

    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    if not sys.dont_write_bytecode:
        _write_cache(cache_dir, cached, name, data)
    return data


def _write_cache(cache_dir: Path, cached: Path, name: str, data: dict[str, Any]) -> None:
    try:
        cache_dir.mkdir(exist_ok=True)
        for old in cache_dir.glob(f"{name}.*.marshal"):
            old.unlink(missing_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(marshal.dumps(data))
        os.replace(tmp, cached)
    except (OSError, ValueError):
        pass  # read-only install: parse every time


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

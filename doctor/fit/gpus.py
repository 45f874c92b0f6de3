"""The GPU catalogue (rules/data/gpus.toml) and what a user may type after `--gpu`:
a card's name or alias (`3090`, `A100-80GB`), or a size (`24GB`, `10GiB`, `16G`)."""

from __future__ import annotations

import re
from typing import Any

from torchdoctor.rules import catalog

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*$", re.IGNORECASE)
# GPU memory is counted in binary units whatever the label: a card sold as "24 GB" has 24 GiB
# (an RTX 3090 reports 25,769,803,776 bytes), so GB and GiB, MB and MiB read alike here. `run
# --gpu-memory` and `fit --gpu` share this grammar so that "24GB" is one size in both.
_UNIT_EXP = {"": 30, "g": 30, "gb": 30, "gib": 30, "m": 20, "mb": 20, "mib": 20, "t": 40, "tb": 40, "tib": 40}


class UnknownGpu(ValueError):
    pass


def size_bytes(text: str) -> int | None:
    """'24GB', '10GiB', '8000MiB', '12' (GiB) -> bytes, binary units (see _UNIT_EXP); None when not a
    size. Zero and negative sizes are not sizes."""
    m = _SIZE.match(text)
    if m is None or m.group(2).lower() not in _UNIT_EXP:
        return None
    value = int(float(m.group(1)) * 2 ** _UNIT_EXP[m.group(2).lower()])
    return value if value > 0 else None


def card(name: str) -> dict[str, Any] | None:
    """The catalogue card a user named (`3090`, `A100-80GB`), or None."""
    key = name.strip().lower()
    return next((c for c in table()["gpu"] if c["name"].lower() == key or key in [a.lower() for a in c["aliases"]]),
                None)


def table() -> dict[str, Any]:
    return catalog.load_toml("gpus.toml")


def _with_context(card: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    out = dict(card)
    out.setdefault("context_bytes", data["assumed_context_bytes"])
    out["context_measured"] = "context_bytes" in card
    return out


def resolve(names: list[str]) -> list[dict[str, Any]]:
    data = table()
    cards = data["gpu"]
    if not names:
        names = list(data["default"])
    out = []
    for name in names:
        named = card(name)
        if named is not None:
            out.append(_with_context(named, data))
            continue
        size = size_bytes(name)
        if size is None:
            known = ", ".join(c["name"] for c in cards)
            raise UnknownGpu(f"unknown GPU {name!r}: give a size (24GB, 10GiB) or one of {known}")
        out.append(_with_context({"name": f"{size / 2**30:g} GB", "aliases": [], "bytes": size,
                                  "major": 8, "minor": 0}, data))
    return out

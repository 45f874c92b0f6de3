"""The GPU catalogue (rules/data/gpus.toml) and what a user may type after `--gpu`:
a card's name or alias (`3090`, `A100-80GB`), or a size (`24GB`, `10GiB`, `16G`)."""

from __future__ import annotations

import re
from typing import Any

from torchdoctor.rules import catalog

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g)?\s*$", re.IGNORECASE)


class UnknownGpu(ValueError):
    pass


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
        key = name.strip().lower()
        card = next((c for c in cards if c["name"].lower() == key or key in [a.lower() for a in c["aliases"]]), None)
        if card is not None:
            out.append(_with_context(card, data))
            continue
        size = _SIZE.match(name)
        if size is None:
            known = ", ".join(c["name"] for c in cards)
            raise UnknownGpu(f"unknown GPU {name!r}: give a size (24GB, 10GiB) or one of {known}")
        # A card sold as "24 GB" reports 24 GiB of memory (the vendors' GB are GiB).
        amount = float(size.group(1))
        out.append(_with_context({"name": f"{amount:g} GB", "aliases": [], "bytes": int(amount * 2**30),
                                  "major": 8, "minor": 0}, data))
    return out

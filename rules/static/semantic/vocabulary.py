"""The vocabulary of names the model recognises (vocabulary.toml), and re-exports made canonical."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any


@cache
def vocabulary() -> dict[str, Any]:
    import tomllib

    with open(Path(__file__).parent.parent / "vocabulary.toml", "rb") as fh:
        data = tomllib.load(fh)
    names = data["names"]
    for key, value in list(names.items()):
        if isinstance(value, list):
            names[key] = frozenset(value)
    rank = data["rank"]
    for key, value in list(rank.items()):
        rank[key] = frozenset(value)
    data["call_sites"] = {key: frozenset(value) for key, value in data["call_sites"].items()}
    data["canonical_prefixes"] = sorted(data["canonical_prefixes"].items(), key=lambda kv: -len(kv[0]))
    return data

@cache
def canonical(name: str) -> str:
    """Re-exported and private paths -> the public name (`torch.nn.modules.linear.Linear` -> `torch.nn.Linear`)."""
    for prefix, replacement in vocabulary()["canonical_prefixes"]:
        if name.startswith(prefix):
            name = replacement + name[len(prefix) :]
            break
    parts = name.split(".")
    if len(parts) >= 4 and parts[:3] == ["torch", "nn", "modules"]:
        return "torch.nn." + parts[-1]
    if len(parts) == 3 and parts[:2] == ["torch", "nn"] and parts[2] == "modules":
        return name
    if len(parts) == 4 and parts[:2] == ["torch", "optim"] and parts[2] not in ("lr_scheduler", "swa_utils"):
        return "torch.optim." + parts[3]
    return name

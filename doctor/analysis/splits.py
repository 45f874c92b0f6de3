"""Which DataLoader holds a validation or test split, from what the loader says about itself.

The data probe (probes/data.py) records each loader's dataset split (a `train` flag, a `split` string) and the
line that built it; this module reads that line's syntax (never executes it) for the names the loader and its
dataset are bound to (`val_loader = DataLoader(val_set, ...)`). A name counts when one of its words (split on `_`,
`.`, case changes) names an evaluation split and none names training.
"""

from __future__ import annotations

import ast
import linecache
import re
from typing import Any

# Words of a split name that mean evaluation data, or training data (a name holding both is undecided)
EVAL_WORDS = frozenset({"val", "valid", "validation", "validate", "test", "testing", "dev", "eval", "evaluation",
                        "holdout", "heldout"})
TRAIN_WORDS = frozenset({"train", "training", "trn", "fit"})


def _words(name: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w.lower() for w in re.split(r"[^A-Za-z0-9]+|\s+", spaced) if w}


def _names(node: ast.AST) -> list[str]:
    """The dotted names and string keys an assignment target or an argument is made of (`self.loaders["val"]`)."""
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.append(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) <= 20:
            out.append(sub.value)
    return out


def binding_names(path: str, line: int | None) -> list[str]:
    """The names at a loader's construction line: what it is assigned to (or returned from: the function's name),
    its first argument and a `dataset=` keyword. Empty when the line does not parse alone."""
    if not path or not line:
        return []
    text = linecache.getline(path, line).strip()
    names: list[str] = []
    for candidate in (text, text.rstrip(",") + ")", text + "))"):
        try:
            tree = ast.parse(candidate)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names += _names(target)
            elif isinstance(node, ast.Call):
                if node.args:
                    names += _names(node.args[0])
                names += [n for kw in node.keywords if kw.arg == "dataset" for n in _names(kw.value)]
        break
    return names


def split_of(loader: dict[str, Any]) -> str | None:
    """'eval' or 'train' for a loader event of the data probe, None when nothing says."""
    flag = loader.get("dataset_train")
    if isinstance(flag, bool):
        return "train" if flag else "eval"
    split = loader.get("dataset_split")
    if isinstance(split, str):
        words = _words(split)
        if words & EVAL_WORDS:
            return "eval"
        if words & TRAIN_WORDS:
            return "train"
    # the construction line, then (a factory function) the lines that called it, innermost first
    places = [loader] + list(reversed(loader.get("callers") or []))
    for place in places:
        words = set().union(*(_words(n) for n in binding_names(place.get("path") or "", place.get("line"))))
        if words & EVAL_WORDS and not words & TRAIN_WORDS:
            return "eval"
        if words & TRAIN_WORDS and not words & EVAL_WORDS:
            return "train"
    return None

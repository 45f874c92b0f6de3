"""Fixes in the framework's own terms: the Lightning, Trainer or Accelerate knob first, plain PyTorch second.

When the report's contexts say the script trains with a framework (a run
sees it loaded, `check` sees it imported; rules/data/frameworks.toml), every
plain-PyTorch fix that makes a change the framework has its own setting for
(clipping, anomaly detection, schedules, accumulation, compilation, fused
optimizers, precision, checkpoints, DDP and its options, samplers, seeds) is
preceded by the framework's form of the same change. The plain form stays:
it is what the framework does underneath, and what a custom loop inside the
framework (Lightning's manual optimization, a custom compute_loss) needs.

The knobs are data; this module only matches fixes to them.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from torchdoctor.model import Fix
from torchdoctor.rules import catalog


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return catalog.load_toml("frameworks.toml")


def framework_ids() -> list[str]:
    return [f["id"] for f in table().get("framework", [])]


def framework_of(contexts: Iterable[str]) -> dict[str, Any] | None:
    """The framework whose terms the advice uses: the first of frameworks.toml among the contexts."""
    present = set(contexts)
    return next((f for f in table().get("framework", []) if f["id"] in present), None)


def knob_for(fix: Fix, framework_id: str, used: set[str]) -> tuple[str, dict[str, Any], str] | None:
    """The first knob (not yet used) that this plain fix makes and the framework has: (id, its form, verify)."""
    text = f"{fix.title}\n{fix.snippet or ''}"
    for knob in table().get("knob", []):
        if knob["id"] in used or framework_id not in knob:
            continue
        if any(m in text for m in knob["matches"]):
            return knob["id"], knob[framework_id], knob.get("verify", fix.verify)
    return None


def in_framework_terms(fixes: list[Fix], contexts: Iterable[str]) -> list[Fix]:
    """`fixes` with the framework's own form of each recognised change right before its plain form."""
    framework = framework_of(contexts)
    if framework is None:
        return fixes
    label = framework["label"]
    used: set[str] = set()
    out: list[Fix] = []
    for fix in fixes:
        if fix.applies_when and fix.applies_when.startswith("training with "):  # already a framework's
            out.append(fix)
            continue
        found = knob_for(fix, framework["id"], used)
        if found is not None:
            knob_id, form, verify = found
            used.add(knob_id)
            out.append(Fix(
                title=f"{label}: {form['title']}",
                snippet=form["snippet"],
                why=f"{form['why']} (The plain-PyTorch form follows.)",
                verify=verify,
                applies_when=f"training with {label}",
            ))
        out.append(fix)
    return out

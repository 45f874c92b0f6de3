"""Which heldout bugs are not blind: their source (issue, pull request, fix commit) is also a dev bug's.

Read by eval_check.py (the `check` labels) and run_bugs/eval_run_bugs.py (the `run` scripts): a heldout bug
whose very fix was rewritten as a dev case has been tuned on, so both evals report heldout with it apart.
"""

from __future__ import annotations

from typing import Any


def source_key(url: str) -> str:
    """An issue, pull request or commit address without its anchor, query and trailing slash."""
    return url.split("#", 1)[0].split("?", 1)[0].rstrip("/").lower()


def shared_sources(bugs: list[dict[str, Any]]) -> set[str]:
    """Ids of heldout bugs whose source is also a dev bug's (a row without a split is dev)."""
    dev = {source_key(b["source"]) for b in bugs if b.get("split", "dev") == "dev" and b.get("source")}
    return {b["id"] for b in bugs if b.get("split") == "heldout" and source_key(b.get("source") or "") in dev}

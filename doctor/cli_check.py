"""CLI commands of the static door: check, rules, explain (see doctor/check.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `check`, `rules` and `explain` to the app (filled in with the rule engine)."""

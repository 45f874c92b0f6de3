"""CLI command of the run-time door: run (see doctor/runner.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `run` to the app (filled in with the runner)."""

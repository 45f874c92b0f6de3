"""Shared fixtures: run the real CLI in a subprocess, validate JSON against the schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def cli(*args: str, input: bytes | str | None = None, env: dict | None = None, cwd=None, timeout: float = 120):
    """Run `python -m torchdoctor.cli ARGS` for real; returns CompletedProcess with text output."""
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
    full_env.pop("FORCE_COLOR", None)
    if env:
        full_env.update(env)
    if isinstance(input, str):
        input = input.encode()
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor.cli", *args],
        input=input,
        capture_output=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )
    proc.stdout_text = proc.stdout.decode("utf-8", "replace")
    proc.stderr_text = proc.stderr.decode("utf-8", "replace")
    return proc


@pytest.fixture(scope="session")
def report_schema() -> dict:
    from torchdoctor.schema import schema

    return schema()


@pytest.fixture(scope="session")
def validate_report(report_schema):
    import jsonschema

    validator = jsonschema.Draft202012Validator(report_schema)

    def validate(obj) -> dict:
        if isinstance(obj, (str, bytes)):
            obj = json.loads(obj)
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
        assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])
        return obj

    return validate


def repeated_lines(text: str) -> list[str]:
    """The lines of a text output that occur more than once, leaving out blank lines and rules
    (`-----`, `=====`, a box's edges): they are layout, not something said twice."""
    from collections import Counter

    said = [line.strip() for line in text.splitlines() if line.strip(" -=─│╭╮╰╯")]
    return [line for line, n in Counter(said).items() if n > 1]

"""The versioned JSON schema of the Report (`torchdoctor schema`)."""

from __future__ import annotations

from pathlib import Path

SCHEMA_FILE = Path(__file__).with_name("report.schema.json")


def schema_text() -> str:
    return SCHEMA_FILE.read_text(encoding="utf-8")


def schema() -> dict:
    import json

    return json.loads(schema_text())

"""Renderers: plain when piped, rich on a terminal, NO_COLOR honoured, Markdown and JSON."""

from __future__ import annotations

import io
import json
import re

import pytest

from tests.conftest import cli
from torchdoctor.ask import build_report
from torchdoctor.render import render, wants_rich

ANSI = re.compile(r"\x1b\[")
OOM = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.69 GiB total capacity; "
    "19.80 GiB already allocated; 1.21 GiB free; 21.10 GiB reserved in total by PyTorch)"
)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def report():
    return build_report("NaN loss with AMP after a few hundred steps")


def test_piped_output_is_plain_text(report):
    out = io.StringIO()
    render(report, "text", out)
    text = out.getvalue()
    assert not ANSI.search(text)
    assert "nan-loss" in text and "--details" in text
    assert "Fix 1:" not in text  # the fix reports are behind --details
    out = io.StringIO()
    render(report, "text", out, details=True)
    text = out.getvalue()
    assert not ANSI.search(text)
    assert "Route" in text and "debugging" in text
    assert "Fix 1:" in text


def test_terminal_gets_rich_colours(report, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    out = FakeTTY()
    render(report, "text", out)
    assert ANSI.search(out.getvalue())


def test_no_color_is_honoured_on_a_terminal(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert not wants_rich(FakeTTY())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not wants_rich(FakeTTY())


def test_markdown_has_sections_and_fenced_snippets(report):
    out = io.StringIO()
    render(report, "markdown", out)
    md = out.getvalue()
    assert md.startswith("# torchdoctor ask")
    assert "## Route" in md
    assert re.search(r"^## 1\. Debugging", md, re.M)
    assert md.count("```") % 2 == 0 and "```python" in md


def test_json_output_of_the_cli_validates(validate_report):
    proc = cli("ask", "--format", "json", OOM)
    assert proc.returncode == 0, proc.stderr_text
    data = validate_report(proc.stdout_text)
    assert data["symptoms"][0]["id"] == "oom"
    assert data["route"][0]["specialist"] == "memory"
    assert data["question"] is None


def test_markdown_output_of_the_cli(validate_report):
    proc = cli("ask", "--format", "markdown", "training is slow")
    assert proc.returncode == 0
    assert "## 1. Performance profiling" in proc.stdout_text


def test_schema_command_prints_the_schema():
    proc = cli("schema")
    assert proc.returncode == 0
    schema = json.loads(proc.stdout_text)
    assert schema["$schema"].startswith("https://json-schema.org/draft/2020-12")
    assert "symptom" in schema["$defs"]


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_routes_command(fmt):
    proc = cli("routes", "--format", fmt)
    assert proc.returncode == 0, proc.stderr_text
    if fmt == "json":
        table = json.loads(proc.stdout_text)
        assert [s["id"] for s in table["specialist"]][:2] == ["memory", "module-design"]
        assert {m["query"] for m in table["mistake"]} >= {"Training slow", "Save model"}
        assert any(s["id"] == "oom" for s in table["symptoms"])
    else:
        assert "NaN with AMP" in proc.stdout_text and "checkpointing" in proc.stdout_text


def test_cli_import_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, torchdoctor.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_jupyter_fragment_shows_the_summary_rows(report):
    """`Report._repr_html_` (Jupyter, watch sessions) renders the summary's table: one row per symptom, the
    severity coloured, every cell escaped."""
    from torchdoctor.render import to_html

    html = to_html(report)
    assert "<table>" in html and "<th" in html
    for symptom in report.symptoms:
        assert f"<td>{symptom.id}" in html, symptom.id
    assert html.count("<tr>") == len(report.symptoms) + 1  # the header and one row each

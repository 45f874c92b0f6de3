"""SARIF 2.1.0 for `check` findings: what GitHub code scanning (and other SARIF viewers) read.

Paths are relative URIs under the `%SRCROOT%` base (the current folder), so
results line up with the repository checkout; every rule carries its docs
(summary, why, the bad and good examples) as help text and Markdown.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from torchdoctor.model import Finding, Report

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _artifact(path: str, root: str) -> dict:
    if path in ("-", "<stdin>"):
        return {"uri": "stdin"}
    absolute = os.path.abspath(path)
    rel = os.path.relpath(absolute, root) if os.path.splitdrive(absolute)[0] == os.path.splitdrive(root)[0] else ".."
    if rel.startswith(".."):
        return {"uri": Path(absolute).as_uri()}
    return {"uri": quote(rel.replace(os.sep, "/")), "uriBaseId": "%SRCROOT%"}


def _descriptor(doc) -> dict:
    from torchdoctor.rules.static.docs import help_markdown, help_text

    first = doc.why.strip().split("\n\n")[0]
    return {
        "id": doc.code,
        "name": "".join(part.capitalize() for part in doc.name.split("-")),
        "shortDescription": {"text": doc.summary},
        "fullDescription": {"text": " ".join(first.split())},
        "help": {"text": help_text(doc), "markdown": help_markdown(doc)},
        "defaultConfiguration": {"level": LEVEL[doc.level]},
        "properties": {
            "tags": ["torchdoctor", "pytorch", doc.specialist, doc.symptom],
            "precision": "low" if doc.calibrated else "high",  # calibrated: its real-code record is weak
            "problem.severity": {"error": "error", "warning": "warning", "info": "recommendation"}[doc.level],
            "specialist": doc.specialist,
            "symptom": doc.symptom,
        },
    }


def _result(f: Finding, rule_index: dict[str, int], root: str) -> dict:
    message = f"{f.message}. Fix: {f.fix}" if not f.message.endswith(".") else f"{f.message} Fix: {f.fix}"
    region: dict = {"startLine": max(1, f.line), "startColumn": max(1, f.col)}
    if f.cell:
        # A notebook is JSON on disk: lines inside a cell do not map to lines of the file.
        message = f"cell {f.cell}, line {f.line}: {message}"
        region = {"startLine": 1}
    else:
        if f.end_line and f.end_line >= f.line:
            region["endLine"] = f.end_line
            if f.end_col and (f.end_line > f.line or f.end_col > f.col):
                region["endColumn"] = f.end_col
        if f.frame and f.frame.get("lines"):
            offset = f.line - f.frame["first_line"]
            if 0 <= offset < len(f.frame["lines"]):
                region["snippet"] = {"text": f.frame["lines"][offset]}
    result: dict = {
        "ruleId": f.code,
        "level": LEVEL[f.severity],
        "message": {"text": message},
        "locations": [{"physicalLocation": {"artifactLocation": _artifact(f.path, root), "region": region}}],
    }
    if f.code in rule_index:
        result["ruleIndex"] = rule_index[f.code]
    properties = {"name": f.name, "symptom": f.symptom, "specialist": f.specialist}
    if f.cell:
        properties["cell"] = f.cell
        properties["cellLine"] = f.line
    result["properties"] = properties
    return result


def to_sarif(report: Report) -> dict:
    from torchdoctor.rules.static import registry

    root = os.getcwd()
    docs = [r.doc for r in registry.rules().values()]
    rule_index = {doc.code: i for i, doc in enumerate(docs)}
    tool = report.tool or {}
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": tool.get("name", "torchdoctor"),
                        "version": tool.get("version", "0"),
                        "semanticVersion": tool.get("version", "0"),
                        "rules": [_descriptor(doc) for doc in docs],
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": Path(root).as_uri().rstrip("/") + "/"}},
                "columnKind": "unicodeCodePoints",
                "invocations": [{"executionSuccessful": True, "commandLine": f"torchdoctor check {report.target or ''}".strip()}],
                "results": [_result(f, rule_index, root) for f in report.findings],
            }
        ],
    }

"""GitHub Actions workflow commands: one `::error`/`::warning`/`::notice` annotation per finding.

    ::error file=train.py,line=12,col=5,endLine=12,endColumn=23,title=TD101 graph-accumulated-across-steps::message

GitHub's escaping: in the message `%`, CR and LF become %25, %0D, %0A; in
properties `:` and `,` (which separate them) become %3A and %2C as well.
"""

from __future__ import annotations

import os

from torchdoctor.model import Finding, Report

LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _path(path: str) -> str:
    if os.path.isabs(path):
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    return path.replace(os.sep, "/")


def annotation(f: Finding) -> str:
    props = [f"file={escape_property(_path(f.path))}"]
    message = f"{f.message}\nFix: {f.fix}"
    if f.cell:
        # Lines of a notebook cell are not lines of the .ipynb file: name the cell instead.
        message = f"cell {f.cell}, line {f.line}: {message}"
    else:
        props.append(f"line={f.line}")
        if f.end_line and f.end_line != f.line:
            props.append(f"endLine={f.end_line}")
        props.append(f"col={f.col}")
        if f.end_col and (f.end_line in (None, f.line)) and f.end_col > f.col:
            props.append(f"endColumn={f.end_col}")
    props.append(f"title={escape_property(f'{f.code} {f.name}')}")
    return f"::{LEVEL[f.severity]} {','.join(props)}::{escape_data(message)}"


def to_annotations(report: Report) -> str:
    return "".join(annotation(f) + "\n" for f in report.findings)

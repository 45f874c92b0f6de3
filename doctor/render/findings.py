"""`check` findings as document blocks: grouped by file, a code frame around each line."""

from __future__ import annotations

from itertools import groupby

from torchdoctor.model import Finding, Report
from torchdoctor.render.document import Block, Frame, Section, Text

MAX_FRAMES_PER_FILE = 50  # past this, one line per finding keeps the report readable


def _where(f: Finding) -> str:
    where = f"{f.path}:{f.line}:{f.col}"
    return f"{f.path}:cell {f.cell}:{f.line}:{f.col}" if f.cell else where


def findings_blocks(report: Report) -> list[Block]:
    blocks: list[Block] = []
    for path, group in groupby(report.findings, key=lambda f: f.path):
        findings = list(group)
        worst = min(findings, key=lambda f: ("error", "warning", "info").index(f.severity)).severity
        children: list[Block] = []
        for n, f in enumerate(findings):
            # The plain and Markdown renderers prefix "error:"/"warning:" from the style; info says so itself.
            prefix = "info: " if f.severity == "info" else ""
            children.append(Text(f"{prefix}{_where(f)}  {f.code} {f.name}: {f.message}", f.severity))
            same_line = n > 0 and (findings[n - 1].cell, findings[n - 1].line) == (f.cell, f.line)  # framed just above
            if n < MAX_FRAMES_PER_FILE and f.frame and f.frame.get("lines") and not same_line:
                label = f"{f.path} (cell {f.cell})" if f.cell else f.path
                children.append(Frame(label, f.frame["first_line"], list(f.frame["lines"]), f.line))
            children.append(Text(f"Fix: {f.fix}", "dim"))
        if len(findings) > MAX_FRAMES_PER_FILE:
            children.append(Text(f"Code frames shown for the first {MAX_FRAMES_PER_FILE} findings of this file.", "dim"))
        title = f"{path} — {len(findings)} finding{'s' if len(findings) != 1 else ''}"
        blocks.append(Section(title, children, style=worst))
    return blocks

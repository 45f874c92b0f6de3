"""Report renderers. Every renderer reads only the `Report`.

text      rich panels on a terminal; plain text when piped or NO_COLOR is set
json      the Report schema (`torchdoctor schema`)
markdown  for a PR comment or an issue
html      check: a whole self-contained page (html_page.py, as report.html of a run);
          a fragment for Jupyter (`to_html`)
sarif     SARIF 2.1.0 (check only)
github    GitHub workflow-command annotations (check only)
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from torchdoctor.model import Report

FORMATS = ("text", "json", "markdown", "sarif", "github")


def wants_rich(stream: TextIO) -> bool:
    """Rich output only on a real terminal, and never with NO_COLOR or TERM=dumb."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def to_json(report: Report) -> str:
    import json  # only the json format needs it

    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False)


def to_markdown(report: Report) -> str:
    from torchdoctor.render import markdown
    from torchdoctor.render.compose import compose

    return markdown.render(compose(report))


def to_html(report: Report) -> str:
    from torchdoctor.render import html
    from torchdoctor.render.compose import compose

    return html.render(compose(report))


def render_blocks(blocks: list, fmt: str = "text", stream: TextIO | None = None) -> None:
    """The one place that decides how document blocks are written: Markdown, rich panels on a
    terminal, plain text otherwise (a pipe, NO_COLOR). Reports, `routes` and `explain` all come here."""
    stream = stream or sys.stdout
    if fmt == "markdown":
        from torchdoctor.render import markdown

        stream.write(markdown.render(blocks))
    elif wants_rich(stream):
        from torchdoctor.render import rich_text

        rich_text.render(blocks, stream)
    else:
        from torchdoctor.render import plain

        stream.write(plain.render(blocks))


def render(report: Report, fmt: str = "text", stream: TextIO | None = None, details: bool = False) -> None:
    """Write a report. Text is the summary, and the full report after it with `details`; Markdown is
    always the full report (it is read later, in a PR or an issue, where nobody can ask for more)."""
    stream = stream or sys.stdout
    if fmt == "json":
        stream.write(to_json(report) + "\n")
        return
    if fmt == "sarif":
        import json

        from torchdoctor.render.sarif import to_sarif

        stream.write(json.dumps(to_sarif(report), indent=2) + "\n")
        return
    if fmt == "html":
        from torchdoctor.render.html_page import page

        stream.write(page(report))
        return
    if fmt == "github":
        from torchdoctor.render.github import to_annotations

        stream.write(to_annotations(report))
        return
    from torchdoctor.render.compose import compose

    render_blocks(compose(report, details=details or fmt == "markdown"), fmt, stream)

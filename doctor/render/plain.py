"""Plain text: what a pipe, a CI log or NO_COLOR gets. No rich import here."""

from __future__ import annotations

import textwrap

from torchdoctor.clip import clip
from torchdoctor.render.document import Block, Bullets, Code, Frame, Heading, Section, Table, Text

WIDTH = 100


def render(blocks: list[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        _emit(block, out, indent="")
    return "\n".join(out).rstrip() + "\n"


def _wrap(text: str, indent: str, hanging: str = "") -> list[str]:
    lines: list[str] = []
    for para in text.splitlines() or [""]:
        lines += textwrap.wrap(para, WIDTH, initial_indent=indent, subsequent_indent=indent + hanging) or [indent]
    return lines


def _emit(block: Block, out: list[str], indent: str) -> None:
    if isinstance(block, Heading):
        out += [block.text, "=" * min(len(block.text), WIDTH), ""]
    elif isinstance(block, Section):
        if out and out[-1]:
            out.append("")  # a section opens a new paragraph
        out += [f"{indent}{block.title}", f"{indent}{'-' * min(len(block.title), WIDTH)}"]
        for child in block.blocks:
            _emit(child, out, indent)
        out.append("")
    elif isinstance(block, Text):
        prefix = {"error": "error: ", "warning": "warning: "}.get(block.style, "")
        if block.style == "info" and out and out[-1]:
            out.append("")  # a fix title opens a new paragraph
        out += _wrap(prefix + block.text, indent)
    elif isinstance(block, Bullets):
        for n, item in enumerate(block.items, 1):
            mark = f"{n}. " if block.numbered else "- "
            first, _, rest = item.partition("\n")
            out += _wrap(mark + first, indent + "  ", " " * len(mark))
            if rest:  # a multi-line item carries code: keep it verbatim, indented under the item
                out += [f"{indent}  {' ' * len(mark)}  {line}" for line in rest.splitlines()]
    elif isinstance(block, Code):
        out += [f"{indent}    {line}" for line in block.code.splitlines()]
    elif isinstance(block, Table):
        out += [indent + line for line in table_lines(block, WIDTH - len(indent))]
    elif isinstance(block, Frame):
        width = len(str(block.first_line + len(block.lines)))
        for offset, line in enumerate(block.lines):
            number = block.first_line + offset
            mark = ">" if number == block.mark_line else " "
            out.append(f"{indent}  {mark} {number:>{width}} | {line}")


def table_lines(table: Table, width: int) -> list[str]:
    """The rows as aligned columns, one line each (no header: the section title says what they are)."""
    if not table.rows:
        return []
    columns = len(table.rows[0])
    widths = [max(len(row[i]) for row in table.rows) for i in range(columns - 1)]
    lead = sum(w + 2 for w in widths)
    room = max(width - lead, 24)  # past this the line runs over rather than cut the last cell to nothing
    lines = []
    for row in table.rows:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)] + [clip(row[-1], room)]
        lines.append("  ".join(cells).rstrip())
    return lines

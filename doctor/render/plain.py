"""Plain text: what a pipe, a CI log or NO_COLOR gets. No rich import here."""

from __future__ import annotations

import textwrap

from torchdoctor.render.document import Block, Bullets, Code, Frame, Heading, Section, Text

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
    elif isinstance(block, Frame):
        width = len(str(block.first_line + len(block.lines)))
        for offset, line in enumerate(block.lines):
            number = block.first_line + offset
            mark = ">" if number == block.mark_line else " "
            out.append(f"{indent}  {mark} {number:>{width}} | {line}")

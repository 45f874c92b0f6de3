"""Markdown: for a PR comment or an issue."""

from __future__ import annotations

from torchdoctor.render.document import Block, Bullets, Code, Frame, Heading, Section, Table, Text


def render(blocks: list[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        _emit(block, out, level=2)
    return "\n".join(out).rstrip() + "\n"


def _fence(code: str) -> str:
    fence = "```"
    while fence in code:
        fence += "`"
    return fence


def _emit(block: Block, out: list[str], level: int) -> None:
    if isinstance(block, Heading):
        out += [f"{'#' * block.level} {block.text}", ""]
    elif isinstance(block, Section):
        out += [f"{'#' * level} {block.title}", ""]
        for child in block.blocks:
            _emit(child, out, level + 1)
    elif isinstance(block, Text):
        text = block.text
        if block.style == "bold":
            text = f"**{text}**"
        elif block.style == "info":
            text = f"**{text}**"
        elif block.style == "dim":
            text = f"_{text}_"
        elif block.style in ("error", "warning"):
            text = f"**{block.style}:** {text}"
        out += [text, ""]
    elif isinstance(block, Bullets):
        for n, item in enumerate(block.items, 1):
            mark = f"{n}." if block.numbered else "-"
            lines = item.splitlines() or [""]
            out.append(f"{mark} {lines[0]}")
            out += [f"   {line}" for line in lines[1:]]
        out.append("")
    elif isinstance(block, Code):
        fence = _fence(block.code)
        out += [f"{fence}{block.language}", block.code, fence, ""]
    elif isinstance(block, Table):
        out.append("| " + " | ".join(block.header) + " |")
        out.append("|" + " --- |" * len(block.header))
        out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in block.rows]
        out.append("")
    elif isinstance(block, Frame):
        fence = _fence("\n".join(block.lines))
        out.append(f"`{block.path}:{block.mark_line}`")
        out.append(f"{fence}python")
        for offset, line in enumerate(block.lines):
            number = block.first_line + offset
            mark = ">" if number == block.mark_line else " "
            out.append(f"{mark} {number} | {line}")
        out += [fence, ""]

"""The rich terminal report: panels per specialist, highlighted snippets."""

from __future__ import annotations

from typing import TextIO

from torchdoctor.render.document import Block, Bullets, Code, Frame, Heading, Section, Table, Text

_STYLES = {
    "bold": "bold",
    "dim": "dim",
    "error": "bold red",
    "warning": "yellow",
    "info": "bold cyan",
    "ok": "green",
}


def render(blocks: list[Block], stream: TextIO) -> None:
    from rich.console import Console

    console = Console(file=stream, highlight=False, soft_wrap=False)
    for block in blocks:
        console.print(_renderable(block))


def _renderable(block: Block):
    from rich.console import Group
    from rich.markup import escape
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.rule import Rule
    from rich.syntax import Syntax
    from rich.text import Text as RichText

    if isinstance(block, Heading):
        return Rule(f"[bold]{escape(block.text)}[/bold]", align="left")
    if isinstance(block, Text):
        return RichText(block.text, style=_STYLES.get(block.style, ""))
    if isinstance(block, Bullets):
        lines = []
        for n, item in enumerate(block.items, 1):
            mark = f"{n}. " if block.numbered else "• "
            line = RichText(mark, style="dim")
            line.append(item)
            lines.append(Padding(line, (0, 0, 0, 2)))
        return Group(*lines)
    if isinstance(block, Code):
        return Padding(Syntax(block.code, block.language, theme="ansi_dark", background_color="default"), (0, 0, 0, 2))
    if isinstance(block, Frame):
        return Syntax(
            "\n".join(block.lines),
            "python",
            line_numbers=True,
            start_line=block.first_line,
            highlight_lines={block.mark_line},
            theme="ansi_dark",
            background_color="default",
        )
    if isinstance(block, Table):
        from rich.table import Table as RichTable

        table = RichTable(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0), expand=True)
        for i in range(len(block.header)):
            if i == len(block.header) - 1:  # the last column gives way: cut, as in plain text
                table.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
            else:  # the others keep their width: an id or a file:line cut short says nothing
                table.add_column(no_wrap=True, min_width=max((len(row[i]) for row in block.rows), default=0))
        for n, row in enumerate(block.rows):
            style = _STYLES.get(block.styles[n] if n < len(block.styles) else "", "")
            table.add_row(RichText(row[0], style=style), *row[1:])
        return table
    if isinstance(block, Section):
        border = {"error": "red", "warning": "yellow"}.get(block.style, "blue")
        return Panel(Group(*[_renderable(b) for b in block.blocks]), title=escape(block.title), title_align="left", border_style=border)
    raise TypeError(f"unknown block {block!r}")

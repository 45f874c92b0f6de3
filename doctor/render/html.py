"""HTML: a self-contained fragment for Jupyter (`Report._repr_html_`), and the symptom cards of report.html.

Reads the same blocks as the other text formats (compose.py), so it says the
same things in the same order. Every piece of text is escaped; no script, no
external style sheet.
"""

from __future__ import annotations

from html import escape

from torchdoctor.render.document import Block, Bullets, Code, Frame, Heading, Section, Table, Text

_COLOURS = {"error": "#b00020", "warning": "#a15c00", "info": "#1a5fb4", "ok": "#26a269", "dim": "#666"}


def render(blocks: list[Block]) -> str:
    out: list[str] = ['<div class="torchdoctor-report" style="font-family: sans-serif; line-height: 1.4">']
    for block in blocks:
        _emit(block, out, level=2)
    out.append("</div>")
    return "\n".join(out)


def _emit(block: Block, out: list[str], level: int) -> None:
    if isinstance(block, Heading):
        out.append(f"<h{block.level}>{escape(block.text)}</h{block.level}>")
    elif isinstance(block, Section):
        colour = _COLOURS.get(block.style)
        border = f"border-left: 4px solid {colour}; " if colour else "border-left: 4px solid #ccc; "
        out.append(f'<section style="{border}padding-left: 0.8em; margin: 0.8em 0">')
        out.append(f"<h{min(level, 6)}>{escape(block.title)}</h{min(level, 6)}>")
        for child in block.blocks:
            _emit(child, out, level + 1)
        out.append("</section>")
    elif isinstance(block, Text):
        text = escape(block.text)
        if block.style == "bold":
            text = f"<b>{text}</b>"
        elif block.style in _COLOURS:
            prefix = f"<b>{block.style}:</b> " if block.style in ("error", "warning") else ""
            text = f'<span style="color: {_COLOURS[block.style]}">{prefix}{text}</span>'
        out.append(f"<p>{text}</p>")
    elif isinstance(block, Bullets):
        tag = "ol" if block.numbered else "ul"
        items = "".join(f"<li>{escape(item).replace(chr(10), '<br>')}</li>" for item in block.items)
        out.append(f"<{tag}>{items}</{tag}>")
    elif isinstance(block, Table):
        head = "".join(f'<th style="text-align: left; padding-right: 1em">{escape(h)}</th>' for h in block.header)
        rows = []
        for i, row in enumerate(block.rows):
            style = block.styles[i] if i < len(block.styles) else ""
            colour = f' style="color: {_COLOURS[style]}"' if style in _COLOURS else ""
            cells = [f"<td{colour if j == 0 else ''}>{escape(cell)}</td>" for j, cell in enumerate(row)]
            rows.append("<tr>" + "".join(cells) + "</tr>")
        out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    elif isinstance(block, Code):
        out.append(f'<pre style="background: #f6f6f6; padding: 0.5em"><code>{escape(block.code)}</code></pre>')
    elif isinstance(block, Frame):
        rows = []
        for offset, line in enumerate(block.lines):
            number = block.first_line + offset
            mark = number == block.mark_line
            row = f"{'&gt;' if mark else ' '} {number} | {escape(line)}"
            rows.append(f"<b>{row}</b>" if mark else row)
        out.append(f"<p><code>{escape(block.path)}:{block.mark_line}</code></p>")
        out.append('<pre style="background: #f6f6f6; padding: 0.5em">' + "\n".join(rows) + "</pre>")

"""A tiny document model between a Report and its text formats.

`compose.py` turns a Report into these blocks once; the plain, rich and
Markdown backends only decide how each block looks. That keeps the three text
formats saying the same things in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# repr=False, eq=False: generating those methods per class costs start-up time
# (see model.py); blocks are never compared or printed.


@dataclass(repr=False, eq=False)
class Heading:
    text: str
    level: int = 1


@dataclass(repr=False, eq=False)
class Text:
    text: str
    style: str = ""  # "", "bold", "dim", "error", "warning", "info", "ok"


@dataclass(repr=False, eq=False)
class Bullets:
    items: list[str]
    numbered: bool = False


@dataclass(repr=False, eq=False)
class Code:
    code: str
    language: str = "python"


@dataclass(repr=False, eq=False)
class Frame:
    """Lines of a user's file around a finding, one of them marked."""

    path: str
    first_line: int
    lines: list[str]
    mark_line: int


@dataclass(repr=False, eq=False)
class Table:
    """Rows of short cells, one line each; the last column gives way (is cut) when a line would be too
    wide. `styles` holds one style per row (a severity or ""), for the first cell."""

    header: list[str]
    rows: list[list[str]]
    styles: list[str] = field(default_factory=list)


@dataclass(repr=False, eq=False)
class Section:
    title: str
    blocks: list = field(default_factory=list)
    style: str = ""  # a severity or "" for a specialist panel


Block = Heading | Text | Bullets | Code | Frame | Table | Section

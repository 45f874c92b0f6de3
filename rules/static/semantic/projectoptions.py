"""Command-line options the whole project declares, known before any file is analysed.

`main.py` declares `parser.add_argument("--milestones", nargs="+", default=[60, 120, 160])` and hands `args` to
`Trainer(model, loader, args)` of `trainer.py`, which builds `MultiStepLR(opt, milestones=args.milestones)` and
loops `for epoch in range(self.args.epochs)`: the file that reads the lengths is not the file that declares them,
so a rule comparing two lengths there knew neither (semantic/options.py reads one file's own declarations).

Like the other pre-pass tables (projectclasses.py, projectcalls.py) this one reads the text of every file with a
pattern, no parse: each `add_argument(` call's first flag (or `dest=`) and the source text of its `default=`. The
text of a default is parsed only when a rule asks for that option (`default`), a few characters at a time. An
option declared with different defaults in two places is left out, as in options.py: which one runs depends on the
script that was started.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

_ADD_ARGUMENT = re.compile(r"\.add_argument\(\s*")
_FLAG = re.compile(r"""(['"])(-{1,2}[\w-]+)\1""")
_KEYWORD = re.compile(r"\b(default|dest)\s*=\s*")


def _scan(text: str, start: int, depth: int) -> int:
    """Where a scan from `start` stops, strings and brackets skipped: at the `)` that closes a call already open
    (`depth` 1: the index after it), or at the first comma at the top level (`depth` 0: the comma's index)."""
    opened, i, quote = depth, start, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if opened and not depth:
                return i + 1
        elif c == "," and not opened and not depth:
            return i
        i += 1
    return -1 if opened else i


def _call_text(text: str, start: int) -> str:
    """The argument text of a call from just after its `(` to its matching `)`."""
    end = _scan(text, start, 1)
    return text[start:end - 1] if end > 0 else ""


def _value_text(args: str, start: int) -> str:
    """The text of one argument value starting at `start`: up to the next comma at the top level."""
    return args[start:_scan(args, start, 0)].strip()


def declared(texts: Iterable[str]) -> dict[str, str]:
    """Option destination -> the source text of its default, over every text; an option two declarations give
    different defaults is left out."""
    found: dict[str, str] = {}
    clashing: set[str] = set()
    for text in texts:
        if "add_argument" not in text:
            continue
        for m in _ADD_ARGUMENT.finditer(text):
            args = _call_text(text, m.end())
            flags = [f.group(2) for f in _FLAG.finditer(args.split("=", 1)[0])]
            values = {k.group(1): _value_text(args, k.end()) for k in _KEYWORD.finditer(args)}
            dest = values.get("dest", "").strip("'\"") or next(
                (f[2:].replace("-", "_") for f in flags if f.startswith("--")), None)
            default = values.get("default")
            if not dest or not default or not dest.isidentifier():
                continue
            if dest in found and found[dest] != default:
                clashing.add(dest)
            found.setdefault(dest, default)
    for dest in clashing:
        del found[dest]
    return found


class ProjectOptions:
    """The project's declared option defaults, parsed on demand."""

    def __init__(self, table: dict[str, str]):
        self.table = table
        self._parsed: dict[str, ast.expr | None] = {}

    def default(self, dest: str) -> ast.expr | None:
        """The default of `--dest` as an expression (`[60, 120, 160]`, `200`), or None when no file of the project
        declares it once, or its text is not an expression."""
        if dest not in self._parsed:
            text = self.table.get(dest)
            value = None
            if text is not None and len(text) < 200:
                try:
                    value = ast.parse(text, mode="eval").body
                except (SyntaxError, ValueError, RecursionError):
                    value = None
            self._parsed[dest] = value
        return self._parsed[dest]

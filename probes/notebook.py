"""Run a notebook's code cells in the script's process, one after the other, like Jupyter's "Run All".

`torchdoctor run notebook.ipynb` converts the notebook in the parent
(doctor/notebook.py: the code cells as `check` reads them, magics and shell
lines turned into `pass`) into one script in the run directory, and passes
its cell table through the run configuration (`"notebook"`). Here each cell
is compiled on its own under the name `<notebook path>:cell <N>`, so every
frame, traceback, stack dump and probe location names the notebook's cell and
the line within it (`train.ipynb:cell 3:4`, as `check` names them), and a
syntax error in a later cell stops the run there, after the earlier cells
ran, as in Jupyter. The cells share one `__main__` namespace. No torch here.
"""

from __future__ import annotations

import linecache
import os
import sys
import types
from typing import Any

CELL_SUFFIX = ":cell "


def cell_name(notebook: str, number: int) -> str:
    """The file name a cell's code is compiled under: '/abs/train.ipynb:cell 3'."""
    return f"{notebook}{CELL_SUFFIX}{number}"


def remember_cells(notebook: str, script_text: str, cells: list[list[int]]) -> list[tuple[str, str]]:
    """Each cell's (file name, source) from the converted script, registered with linecache.

    linecache keeps entries whose modification time is None (`checkcache` leaves them),
    so tracebacks and the analysis show the cell's own lines, not the notebook's JSON.
    """
    lines = script_text.split("\n")
    out = []
    for number, first, count in cells:
        text = "\n".join(lines[first - 1:first - 1 + count]) + "\n"
        name = cell_name(notebook, number)
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
        out.append((name, text))
    return out


def run_cells(spec: dict[str, Any], main: types.ModuleType) -> None:
    """Run the notebook described by `spec` ({"path", "script", "cells"}) in the module `main`."""
    notebook = spec["path"]
    if not sys.flags.safe_path:
        sys.path[0] = os.path.dirname(notebook)  # Jupyter's kernel imports from the notebook's folder
    with open(spec["script"], encoding="utf-8") as fh:
        script_text = fh.read()
    show_cell_lines()
    for name, text in remember_cells(notebook, script_text, spec["cells"]):
        code = compile(text, name, "exec", dont_inherit=True)
        exec(code, main.__dict__)


def show_cell_lines() -> None:
    """Tracebacks with the cells' own lines: the interpreter's default hook reads source files from disk,
    where a cell is not; Python's `traceback` module reads linecache, where it is (same format)."""
    if sys.excepthook is sys.__excepthook__:
        import traceback

        sys.excepthook = traceback.print_exception

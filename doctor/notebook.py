"""`torchdoctor run notebook.ipynb`: the notebook's code cells as one script in the run directory.

The cells are read by `check`'s own notebook reader (rules/static/sources.py
`notebook_unit`): code cells joined, IPython magics (`%…`), shell escapes
(`!…`) and help lines (`x?`) as `pass` at the same indentation, cells under a
cell magic (`%%bash`, `%%writefile`…) skipped, `%%time`-like ones kept. The
joined source goes to `notebook.torchdoctor.py` in the run directory — never next to the
user's notebook — and the child runs it cell by cell (probes/notebook.py),
from the notebook's folder, with that folder as `sys.path[0]`, like a Jupyter
kernel started there.

Each cell is compiled under the name `<notebook>:cell <N>`, so what the probes
and the analysis see is already the notebook's cell and line; `relocate`
finally splits such a path into the report's `path` and `cell`, the way
`check` reports a notebook's findings. No torch here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchdoctor.probes.notebook import CELL_SUFFIX, remember_cells

SCRIPT_NAME = "notebook.torchdoctor.py"  # in the run directory (run_files.RUN_FILES); not a name a user picks
_CELL_PATH = re.compile("^(?P<path>.+\\.ipynb)" + re.escape(CELL_SUFFIX) + r"(?P<cell>\d+)$")


class NotebookError(ValueError):
    """A notebook `run` cannot read: one sentence for the user (exit code 2)."""


@dataclass
class Notebook:
    path: str  # absolute
    text: str  # the code cells joined, magics as `pass`
    cells: list[list[int]]  # [number, first line in `text`, line count] per code cell that runs
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (cell number, why)
    magics: int = 0  # magic and shell lines turned into `pass`
    timed: int = 0  # `%time STATEMENT` lines run as the plain statement
    script: str | None = None  # the converted script, once written

    @property
    def folder(self) -> str:
        return os.path.dirname(self.path)

    def write(self, run_dir: Path) -> None:
        """The converted script in the run directory (the user's folders are never written to)."""
        target = run_dir / SCRIPT_NAME
        target.write_text(self.text + "\n", encoding="utf-8")
        self.script = str(target)

    def config(self) -> dict[str, Any]:
        """What the child needs (TORCHDOCTOR_RUN's `notebook`)."""
        return {"path": self.path, "script": self.script, "cells": self.cells}

    def remember_lines(self) -> None:
        """The cells' lines for linecache in this process too: the analysis quotes the user's lines."""
        remember_cells(self.path, self.text, self.cells)

    def notes(self) -> list[str]:
        """What the report says about the conversion: cells that ran, lines skipped or translated."""
        def count(n: int, what: str) -> str:
            return f"{n} {what}{'' if n == 1 else 's'}"

        ran = f"Ran the notebook's {count(len(self.cells), 'code cell')} in order, in one namespace"
        if self.magics:
            ran += f"; skipped {count(self.magics, 'IPython magic or shell line')}"
        if self.timed:
            ran += f"; ran {count(self.timed, '`%time`/`%timeit` line')} as plain Python"
        notes = [ran + f" (the converted script: {SCRIPT_NAME} in the run directory)."]
        for number, why in self.skipped:
            notes.append(f"Cell {number} did not run ({why}): `torchdoctor run` runs Python cells only.")
        return notes


def read_notebook(path: Path) -> Notebook:
    """Read and convert a notebook; NotebookError with one sentence when it cannot be read."""
    from torchdoctor.rules.static.sources import UnreadableSource, notebook_unit

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise NotebookError(f"cannot read the notebook {path.name}: {exc.strerror or exc}") from None
    try:
        unit = notebook_unit(str(path), data)
    except UnreadableSource as exc:
        raise NotebookError(f"cannot run the notebook {path.name}: {exc}") from None
    cells = [[c.number, c.first_line, c.line_count] for c in unit.cells]
    magics, timed = _magic_lines(data, unit)
    return Notebook(path=str(path.resolve()), text=unit.text, cells=cells, skipped=unit.skipped_cells,
                    magics=magics, timed=timed)


def _magic_lines(data: bytes, unit: Any) -> tuple[int, int]:
    """Lines of the cells that run which the reader turned into `pass` (magics, shell escapes), and into
    the statement they time (`%time x = f()`)."""
    import json

    cells = json.loads(data.decode("utf-8-sig"))["cells"]  # read once already: valid
    joined = unit.text.split("\n")
    skipped = timed = 0
    for cell in unit.cells:
        source = cells[cell.number - 1].get("source", "")
        if isinstance(source, list):
            source = "".join(s for s in source if isinstance(s, str))
        written = source.split("\n")
        ran = joined[cell.first_line - 1:cell.first_line - 1 + cell.line_count]
        for a, b in zip(written, ran, strict=False):
            if a.strip() != b.strip():  # not a cell's leading indentation taken off (sources._strip_leading_indent)
                skipped += b.strip() == "pass"
                timed += b.strip() != "pass"
    return skipped, timed


def split_cell_path(path: str) -> tuple[str, int | None]:
    """'train.ipynb:cell 3' -> ('train.ipynb', 3); any other path -> (path, None)."""
    m = _CELL_PATH.match(path)
    return (m.group("path"), int(m.group("cell"))) if m else (path, None)


def relocate(found: Any) -> None:
    """Every location in a run's analysis (a RunAnalysis) that names a cell gets `path` and `cell` apart."""
    for symptom in found.symptoms:
        _split(symptom.location)
        for ev in symptom.evidence:
            _split(ev.location)
    if found.error is not None:
        _split(found.error.location)


def _split(location: Any) -> None:
    if location is None or location.cell is not None:
        return
    path, cell = split_cell_path(location.path)
    if cell is not None:
        location.path, location.cell = path, cell

"""What `check` reads: finding files under directories, decoding them, notebook cells.

Nothing here imports or runs the user's code: files are read as bytes,
decoded as Python source would be (PEP 263 coding cookie, UTF-8 by default),
and notebooks are read as JSON.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from torchdoctor.rules.static.gitignore import IgnoreFile, is_ignored

SOURCE_SUFFIXES = (".py", ".ipynb")
# How many times `max-file-bytes` a notebook file may be on disk: the limit applies to its code cells.
NOTEBOOK_FILE_ALLOWANCE = 16

# Directories nobody wants checked: virtual environments, caches, VCS metadata.
DEFAULT_EXCLUDE = (
    ".git/",
    ".hg/",
    ".svn/",
    ".venv/",
    "venv/",
    ".env/",
    "env/",
    "__pycache__/",
    ".tox/",
    ".nox/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".pytest_cache/",
    ".ipynb_checkpoints/",
    ".eggs/",
    "node_modules/",
    "site-packages/",
    "build/",
    "dist/",
    "*.egg-info/",
)

# Tests and benchmarks exercise training code, they are not training code: a test that builds a model
# and calls backward once is not a training loop missing zero_grad. Skipped in a directory walk unless
# `include-tests = true`; a file or folder named on the command line is always checked.
TEST_EXCLUDE = (
    "tests/",
    "test/",
    "testing/",
    "benchmarks/",
    "benchmark/",
    "test_*.py",
    "*_test.py",
    "test_*.ipynb",
    "conftest.py",
)


class UnreadableSource(Exception):
    """A file that cannot be analysed; the message becomes a TD000 finding."""


@dataclass
class Cell:
    number: int  # 1-based position among all the notebook's cells
    first_line: int  # first line of the cell in the concatenated source
    line_count: int


@dataclass
class Unit:
    """One analysable source: a .py file, stdin, or a notebook's code cells joined."""

    path: str
    text: str
    cells: list[Cell] = field(default_factory=list)
    skipped_cells: list[tuple[int, str]] = field(default_factory=list)  # (cell number, why)

    def cell_at(self, line: int) -> tuple[Cell | None, int]:
        """The cell holding a line of the joined source, and the line within that cell."""
        for cell in self.cells:
            if cell.first_line <= line < cell.first_line + cell.line_count:
                return cell, line - cell.first_line + 1
        return None, line


# -- decoding ---------------------------------------------------------------------------------


def decode_python(data: bytes) -> str:
    """Bytes of a .py file -> text, as the interpreter would decode them."""
    if b"\x00" in data:
        raise UnreadableSource("the file contains NUL bytes (a binary file?)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if "invalid or missing encoding declaration" in str(exc.msg):
            encoding = "utf-8"  # undecodable bytes in the first two lines: reported below with their offset
        elif "unknown encoding" in str(exc.msg):
            # A codec the interpreter here lacks is almost always a source-transform codec installed with the
            # project (`# -*- coding: future_fstrings -*-`): its input is UTF-8 text, so read that.
            encoding = "utf-8"
        else:
            raise UnreadableSource(f"bad encoding declaration: {exc.msg}") from None
    try:
        return data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        where = f" at byte {exc.start}" if isinstance(exc, UnicodeDecodeError) else ""
        hint = " (and no `# -*- coding: ... -*-` line declares another encoding)" if encoding.startswith("utf-8") else ""
        raise UnreadableSource(f"not valid {encoding} text{where}{hint}") from None


_MAGIC = re.compile(r"^\s*[%!]|^\s*\?|^[^#'\"\n]*\?\s*$")
_PASSTHROUGH_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun", "%%torchdoctor")


def notebook_unit(path: str, data: bytes) -> Unit:
    """The code cells of a notebook joined into one source; magics become `pass`."""
    try:
        nb = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise UnreadableSource("the notebook is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise UnreadableSource(f"not a valid notebook: JSON error at line {exc.lineno}: {exc.msg}") from None
    version = nb.get("nbformat") if isinstance(nb, dict) else None
    if isinstance(version, int) and version != 4:
        raise UnreadableSource(f"an nbformat {version} notebook; torchdoctor reads nbformat 4 (convert it with "
                               "`jupyter nbconvert --to notebook --nbformat 4`)")
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise UnreadableSource("not a valid notebook: no list of cells")
    language = ""
    if isinstance(nb.get("metadata"), dict):
        info = nb["metadata"].get("language_info") or nb["metadata"].get("kernelspec") or {}
        language = str(info.get("name") or info.get("language") or "") if isinstance(info, dict) else ""
    if language and "python" not in language.lower():
        raise UnreadableSource(f"a {language} notebook, not Python")

    unit = Unit(path=path, text="")
    parts: list[str] = []
    line = 1
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(s for s in source if isinstance(s, str))
        if not isinstance(source, str):
            continue
        lines = source.split("\n")
        first = lines[0].strip() if lines else ""
        if first.startswith("%%"):
            if not first.startswith(_PASSTHROUGH_CELL_MAGICS):
                unit.skipped_cells.append((number, f"cell magic {first.split()[0]}"))
                continue
        lines = _neutralise_cell(_strip_leading_indent(lines))
        unit.cells.append(Cell(number, line, len(lines)))
        parts.append("\n".join(lines))
        line += len(lines)
    unit.text = "\n".join(parts)
    return unit


def _strip_leading_indent(lines: list[str]) -> list[str]:
    """A cell whose first code line is indented, as IPython runs it: that indentation taken off every line
    that starts with it (IPython's cleanup before it compiles a cell; a stray space pasted before a statement
    runs in Jupyter and must not read as a syntax error here)."""
    first = next((text for text in lines if text.strip()), "")
    indent = first[: len(first) - len(first.lstrip(" \t"))]
    if not indent:
        return lines
    return [text[len(indent):] if text.startswith(indent) else text for text in lines]


# `%time STATEMENT` and `%timeit STATEMENT` (no options) time Python code: keep the statement, which later
# lines may need (`%time model = train()`) and rules should read.
_TIMED = re.compile(r"^(\s*)%(?:time|timeit)\s+(?!-)(\S.*)$")


def _neutralise_cell(lines: list[str]) -> list[str]:
    """Each line through `_neutralise`; a magic or shell line that ends in a backslash goes on to the next line
    (`!python finetune.py \\` then `    --bf16 \\`, Qwen's fine-tuning notebooks), so its continuation lines are
    shell text too: `pass` at the indentation of the line that started the command.

    Like IPython, a magic only starts a statement: inside an open bracket, a triple-quoted string or after a
    Python line's backslash, `%` is an operator (`print("... %d" \n    % (epoch + 1))`, d2l's notebooks)."""
    out: list[str] = []
    carried: str | None = None  # the indentation of a shell/magic command still going on
    depth, quote, joined = 0, None, False  # open brackets, an open triple quote, a backslash: Python goes on
    for text in lines:
        if carried is not None:
            out.append(carried + "pass")
        elif depth or quote or joined:
            out.append(text)
            depth, quote = _scan(text, depth, quote)
            joined = not quote and text.rstrip().endswith("\\")
        else:
            out.append(_neutralise(text))
            if _MAGIC.match(text) and not _TIMED.match(text):
                carried = text[: len(text) - len(text.lstrip())]
            else:
                depth, quote = _scan(out[-1], 0, None)
                joined = not quote and text.rstrip().endswith("\\")
        if carried is not None and not text.rstrip().endswith("\\"):
            carried = None
    return out


def _scan(line: str, depth: int, quote: str | None) -> tuple[int, str | None]:
    """The brackets still open and the triple quote still open after a line of Python (strings and comments
    skipped); close enough for telling a continuation line from a new statement."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if quote:
            if c == "\\":
                i += 2
            elif line.startswith(quote, i):
                i += len(quote)
                quote = None
            else:
                i += 1
            continue
        if c == "#":
            break
        if c in "\"'":
            quote = line[i:i + 3] if line[i:i + 3] in ('"""', "'''") else c
            i += len(quote)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(depth - 1, 0)
        i += 1
    return depth, quote if quote and len(quote) == 3 else None


def _neutralise(line: str) -> str:
    """A magic or shell line -> `pass` at the same indentation (keeps line numbers and blocks)."""
    timed = _TIMED.match(line)
    if timed:
        return timed.group(1) + timed.group(2)
    if _MAGIC.match(line):
        indent = line[: len(line) - len(line.lstrip())]
        return indent + "pass"
    return line


def file_kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    for test, words in (
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return words
    return None if stat.S_ISREG(mode) else "not a regular file"


def _not_regular(kind: str) -> UnreadableSource:
    return UnreadableSource(f"{kind}, not a regular file: not read (`-` reads standard input)")


def read_unit(path: str, display: str, max_bytes: int) -> Unit:
    """Read one file for analysis; raises UnreadableSource with a one-line reason."""
    notebook = display.endswith(".ipynb")
    unit = unit_from_bytes(display, read_source(path, display, max_bytes))
    if notebook and len(unit.text.encode("utf-8")) > max_bytes:
        raise _too_large("its code", len(unit.text.encode("utf-8")), max_bytes)
    return unit


def read_source(path: str, display: str, max_bytes: int) -> bytes:
    """One file's bytes, for the analysis or the project pre-pass; raises UnreadableSource with a one-line reason.

    Only regular files are read: a named pipe would block forever and a device
    such as /dev/zero never ends. The file is opened without blocking and
    checked again on the open descriptor, so a path swapped in between cannot slip through.
    """
    try:
        kind = file_kind(os.stat(path).st_mode)
        if kind is not None:
            raise _not_regular(kind)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fd)
            kind = file_kind(info.st_mode)
            if kind is not None:
                raise _not_regular(kind)
            notebook = display.endswith(".ipynb")
            # A notebook's bytes are mostly its saved outputs (base64 images): the limit is for the code
            # analysed, so a notebook may be larger on disk, up to a hard cap that still bounds the JSON parse.
            cap = max_bytes * NOTEBOOK_FILE_ALLOWANCE if notebook else max_bytes
            if info.st_size > cap:
                raise _too_large("the file", info.st_size, cap)
            return fh.read()
    except UnreadableSource:
        raise
    except OSError as exc:
        raise UnreadableSource(f"cannot read the file: {exc.strerror or exc}") from None


def _too_large(what: str, size: int, limit: int) -> UnreadableSource:
    return UnreadableSource(
        f"{what} is {size / 2**20:.1f} MiB, over the {limit / 2**20:.1f} MiB limit "
        "(raise `max-file-bytes` in [tool.torchdoctor] to analyse it)"
    )


_DATABRICKS_HEADER = "# Databricks notebook source"


def unit_from_bytes(display: str, data: bytes) -> Unit:
    if display.endswith(".ipynb"):
        return notebook_unit(display, data)
    text = decode_python(data)
    if text.lstrip("\ufeff").startswith(_DATABRICKS_HEADER):
        # A Databricks notebook exported as .py (dolly's train_dolly.py): its cells may hold `!shell` and `%magic`
        # lines, as a Jupyter cell does; they become `pass`, line for line, and the Python around them is analysed.
        text = "\n".join(_neutralise_cell(text.split("\n")))
    return Unit(path=display, text=text)


# -- discovery -------------------------------------------------------------------------------


def default_excludes() -> IgnoreFile:
    """The built-in directory excludes; they match by name at any depth."""
    return IgnoreFile("", DEFAULT_EXCLUDE)


def test_excludes() -> IgnoreFile:
    """Tests and benchmarks, by name at any depth (see TEST_EXCLUDE)."""
    return IgnoreFile("", TEST_EXCLUDE)


def is_test_path(path: str) -> bool:
    """Whether `path` (a file or folder the user named) is itself a test or benchmark path."""
    name = os.path.basename(os.path.normpath(path))
    return is_ignored((test_excludes(),), _norm(path), os.path.isdir(path)) or name in ("tests", "test")


def _norm(path: str) -> str:
    return os.path.abspath(path).replace(os.sep, "/")


def _read_ignore_file(directory: str) -> IgnoreFile | None:
    try:
        with open(os.path.join(directory, ".gitignore"), encoding="utf-8", errors="replace") as fh:
            return IgnoreFile(_norm(directory), fh.read().splitlines())
    except OSError:
        return None


def _git_root(directory: str) -> str | None:
    current = os.path.abspath(directory)
    while True:
        if os.path.exists(os.path.join(current, ".git")):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _parent_ignore_files(directory: str) -> list[IgnoreFile]:
    """The .gitignore files between the enclosing git work tree's root and `directory` (exclusive)."""
    root = _git_root(directory)
    if root is None:
        return []
    chain: list[IgnoreFile] = []
    current = os.path.abspath(directory)
    parents: list[str] = []
    while current != root:
        current = os.path.dirname(current)
        parents.append(current)
        if len(parents) > 64:
            break
    for parent in reversed(parents):
        f = _read_ignore_file(parent)
        if f is not None:
            chain.append(f)
    return chain


def walk(directory: str, excludes: Sequence[IgnoreFile], respect_gitignore: bool = True) -> Iterator[str]:
    """Source files under `directory`, sorted, skipping what .gitignore files and `exclude` skip.

    The directory named by the user is always entered, even if a pattern
    would exclude it; patterns apply to what lies below it.
    """
    chain = _parent_ignore_files(directory) if respect_gitignore else []
    stack: list[tuple[str, list[IgnoreFile]]] = [(directory, chain)]
    while stack:
        current, inherited = stack.pop()
        files = inherited
        if respect_gitignore:
            own = _read_ignore_file(current)
            if own is not None:
                files = [*inherited, own]
        try:
            with os.scandir(current) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs: list[str] = []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                if not is_dir and not entry.is_file():
                    continue
            except OSError:
                continue
            absolute = _norm(entry.path)
            if is_ignored((*excludes, *files), absolute, is_dir):
                continue
            if is_dir:
                subdirs.append(entry.path)
            elif entry.name.endswith(SOURCE_SUFFIXES):
                yield entry.path
        stack.extend((d, files) for d in reversed(subdirs))

"""Which files are the user's: the frames a report should point at.

A frame is the user's when its file is a real file that is not part of
Python's standard library, an installed package (site-packages /
dist-packages), PyTorch or torchdoctor. Among several, frames under the
script's directory (the project) are preferred. Pure Python, no torch: the
probes use it inside the script's process and the analysis in the parent
(on faulthandler stacks).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable
from functools import lru_cache


def _library_roots() -> tuple[str, ...]:
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        roots.add(os.path.realpath(os.path.join(prefix, "lib")))
    return tuple(sorted(roots, key=len, reverse=True))


_LIBRARY_ROOTS = _library_roots()
_CELL_PREFIXES = ("<ipython-input-",)  # IPython's name for a cell's code (ipykernel names it as a file)
_PACKAGE_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


@lru_cache(maxsize=4096)
def is_library_file(path: str) -> bool:
    """True for the standard library, installed packages, torch and torchdoctor itself."""
    if path.startswith(_CELL_PREFIXES):
        return False  # an IPython cell (`%%torchdoctor`, torchdoctor.watch() in a cell): the user's own code
    if not path or path.startswith("<"):
        return True  # <frozen …>, <string>, <stdin>: not a file a user can open
    real = os.path.realpath(path)
    if any(marker in real for marker in _PACKAGE_MARKERS):
        return True
    if _in_torchdoctor(real):
        return True
    return any(real == root or real.startswith(root + os.sep) for root in _LIBRARY_ROOTS)


def in_torchdoctor(path: str) -> bool:
    """Whether `path` is a file of torchdoctor's own code."""
    return bool(path) and not path.startswith("<") and _in_torchdoctor(os.path.realpath(path))


def _in_torchdoctor(real: str) -> bool:
    # The editable install maps doctor/, probes/, rules/, specialists/ into one package.
    here = os.path.dirname(os.path.realpath(__file__))
    repo = os.path.dirname(here)
    parts = ("doctor", "probes", "rules", "specialists")
    return any(real.startswith(os.path.join(repo, p) + os.sep) for p in parts)


def is_user_file(path: str, project: str | None = None) -> bool:
    """A file of the user's: not a library file; under `project` when one is given."""
    if is_library_file(path):
        return False
    if project is None:
        return True
    real = os.path.realpath(path)
    root = os.path.realpath(project)
    return real == root or real.startswith(root + os.sep)


def pick_user_frame(
    frames: Iterable[tuple[str, int | None, str]], project: str | None
) -> tuple[str, int | None, str] | None:
    """The deepest frame (path, line, function) that is the user's.

    `frames` runs from the outermost call to the innermost, like a traceback.
    Frames under the project directory win; failing that, any non-library
    frame; failing that, None.
    """
    frames = list(frames)
    for wanted_project in (project, None) if project else (None,):
        for frame in reversed(frames):
            if is_user_file(frame[0], wanted_project):
                return frame
    return None


def display_path(path: str, cwd: str | None = None) -> str:
    """A path as a user would type it: relative to the working directory when under it."""
    cwd = cwd or os.getcwd()
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if rel.startswith(os.pardir) else rel

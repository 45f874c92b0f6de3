"""Precompiled rule data: built once, then read back with marshal on every later run.

Parsing the TOML data (tomllib is pure Python) and tokenising the phrase vocabulary cost more than
the rest of `torchdoctor ask`. Their results are stored as marshal files, keyed by the package
version and a hash of the sources they are built from (the data file, and the code that compiles
it), so an edited file or an upgraded package is never served stale data, whatever the mtimes say.

Where: `$TORCHDOCTOR_CACHE_DIR` if set, else the user cache directory
(`$XDG_CACHE_HOME/torchdoctor`, `~/.cache/torchdoctor`), else `rules/data/__pycache__` beside the
data (like .pyc files, not written under PYTHONDONTWRITEBYTECODE). The first that can be written is
used; when none can (a read-only home and install), the data is built on every run, which is only
slower. `TORCHDOCTOR_CACHE_DIR=off` turns caching off.
"""

from __future__ import annotations

import marshal
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).parent / "data" / "__pycache__"
OFF = ("off", "0", "no", "none")


def directories() -> list[Path]:
    """Cache directories, in the order they are tried."""
    explicit = os.environ.get("TORCHDOCTOR_CACHE_DIR")
    if explicit is not None:
        return [] if explicit.strip().lower() in OFF else [Path(explicit)]
    dirs = []
    home = os.path.expanduser("~")  # stays "~" when there is no home to expand
    base = os.environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home != "~" else "")
    if base:
        dirs.append(Path(base) / "torchdoctor")
    dirs.append(PACKAGE_DIR)
    return dirs


def key(sources: Sequence[Path]) -> str:
    """The package version and the content of every source: length and CRC-32 of each.

    zlib, not hashlib: importing hashlib (OpenSSL) alone costs more than the whole cache saves, and
    this key only has to notice an edit, not resist a forgery.
    """
    import zlib

    from torchdoctor import __version__

    parts = [__version__]
    for path in sources:
        data = path.read_bytes()
        parts.append(f"{len(data):x}{zlib.crc32(data):08x}")
    return "-".join(parts)


def cached(name: str, sources: Sequence[Path], build: Callable[[], Any]) -> Any:
    """`build()`'s result for `sources`, from the cache when a current copy is there."""
    dirs = directories()
    if not dirs:
        return build()
    file_name = f"{name}.{key(sources)}.marshal"
    for directory in dirs:
        try:
            return marshal.loads((directory / file_name).read_bytes())
        except (OSError, ValueError, EOFError, TypeError):
            continue
    data = build()
    for directory in dirs:
        if directory == PACKAGE_DIR and sys.dont_write_bytecode:
            continue
        if _write(directory, name, file_name, data):
            break
    return data


def _write(directory: Path, name: str, file_name: str, data: Any) -> bool:
    """Write atomically (a concurrent reader sees the old file or the whole new one); drop older copies."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob(f"{name}.*.marshal"):
            if old.name != file_name:
                old.unlink(missing_ok=True)
        tmp = directory / f"{file_name}.{os.getpid()}.tmp"
        tmp.write_bytes(marshal.dumps(data))
        os.replace(tmp, directory / file_name)
        return True
    except (OSError, ValueError):
        return False

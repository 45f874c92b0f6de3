"""The run directory's own files: which names a run writes, and the manifest that proves which it wrote.

A reused `--out DIR` may hold files that look like ours: an earlier run's evidence, or a user's own
`lr_curves.csv`. A name alone proves nothing, so every finished run records in `MANIFEST` each file of
its own with its size and modification time. The next run into the same directory deletes a file only when
the manifest names it and it is unchanged since; any other file with one of our names makes the run refuse
(exit 2) before anything is started, naming the file. Files with other names are never touched. No torch.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from torchdoctor.notebook import SCRIPT_NAME

MANIFEST = ".torchdoctor-run.json"
MANIFEST_VERSION = 1
# Every file a run writes into its directory: the per-rank files (probes/session.py `rank_file`: the
# session's events, steps, stacks and crash stacks, the memory probe's snapshot, the profile probe's trace,
# the watchdog's heartbeat counter, which the supervisor deletes when the run ends),
# the parent's own files (the schedule analysis's lr_curves.csv, a notebook's converted script:
# doctor/notebook.py) and the report, as JSON and as HTML, with their temporary copies (runner.write_report).
RANK_FILES = ("events.jsonl", "steps.jsonl", "stacks.txt", "crash.txt", "memory_snapshot.pickle", "trace.json",
              "heartbeat.bin")
RUN_FILES = ("report.json", "report.html", "lr_curves.csv", SCRIPT_NAME)
OUR_FILES = re.compile(
    "^(" + "|".join([re.escape(name) for name in RUN_FILES] + [r"report\.(json|html)\.\d+\.tmp"] + [
        re.escape(stem) + r"\.rank\d+\." + re.escape(suffix)
        for stem, _, suffix in (name.partition(".") for name in RANK_FILES)]) + ")$"
)


class ForeignFile(Exception):
    """A file with one of our names that torchdoctor cannot prove it wrote; `path` names it."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path.name} {why}")
        self.path = path
        self.why = why


def _stamp(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def read_manifest(run_dir: Path) -> dict[str, dict[str, int]]:
    """The files an earlier finished run recorded, name -> stamp; {} when there is no readable manifest."""
    try:
        data = json.loads((run_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        return {}
    return {name: stamp for name, stamp in files.items() if isinstance(stamp, dict)}


def claim(run_dir: Path) -> list[str]:
    """Make `run_dir` ready for a run: delete an earlier run's proven files, refuse anything else of our names.

    Raises `ForeignFile` before deleting anything, so a refused directory is left exactly as it was. Returns
    the names deleted.
    """
    recorded = read_manifest(run_dir)
    ours: list[Path] = []
    for path in sorted(run_dir.iterdir()):
        if not OUR_FILES.match(path.name):
            continue
        if path.is_symlink() or not path.is_file():
            raise ForeignFile(path, "is not a file torchdoctor wrote")
        stamp = recorded.get(path.name)
        if stamp is None:
            raise ForeignFile(path, "was not written by a torchdoctor run that finished here")
        if _stamp(path) != {"size": stamp.get("size"), "mtime_ns": stamp.get("mtime_ns")}:
            raise ForeignFile(path, "has changed since torchdoctor wrote it")
        ours.append(path)
    for path in ours:
        path.unlink()
    if recorded:
        (run_dir / MANIFEST).unlink(missing_ok=True)
    return [path.name for path in ours]


def record(run_dir: Path) -> None:
    """Write the manifest of every file of ours now in `run_dir` (after the report is written)."""
    files: dict[str, dict[str, int]] = {}
    for path in sorted(run_dir.iterdir()):
        if OUR_FILES.match(path.name) and path.is_file() and not path.is_symlink():
            try:
                files[path.name] = _stamp(path)
            except OSError:
                continue
    tmp = run_dir / f"{MANIFEST}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"version": MANIFEST_VERSION, "files": files}, indent=1) + "\n",
                       encoding="utf-8")
        os.replace(tmp, run_dir / MANIFEST)
    except OSError:
        # Without a manifest the next run refuses this directory instead of deleting: the safe side.
        tmp.unlink(missing_ok=True)

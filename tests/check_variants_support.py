"""What every variant-table test module shares: the shapes of a family, the findings `check` gives a folder, and the
lines a `bad` project marks.

A variant is a folder `tests/fixtures/check/variants/<family>/<shape>/` with a `bad` project (the line a diagnosis
must name carries a marker comment) and a `good` twin that must stay silent. Each test module keeps its own
families, codes and known misses; this module only reads folders."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import FIXTURES, cli
from torchdoctor.check import CheckRequest, build_report, prepare

VARIANTS = FIXTURES / "check" / "variants"
BUG = re.compile(r"#\s*BUG\s*$")


def shapes(families) -> list[tuple[str, str]]:
    """(family, shape) for every shape folder of the given families, sorted."""
    return sorted((family, shape.name) for family in families
                  for shape in (VARIANTS / family).iterdir() if shape.is_dir())


def findings(folder: Path, monkeypatch, codes=None) -> list[tuple[str, int, str]]:
    """(file name, line, code) of what `check .` reports inside `folder`, in this process, limited to `codes`."""
    monkeypatch.chdir(folder)
    request = CheckRequest(paths=["."], fmt="json", fail_on="never")
    return [(Path(f.path).name, f.line, f.code) for f in build_report(request, prepare(request)).findings
            if codes is None or f.code in codes]


def findings_of_the_cli(folder: Path, codes) -> list[tuple[str, int, str]]:
    """The same, from a real `torchdoctor check FOLDER --format json` subprocess."""
    import json

    done = cli("check", str(folder), "--format", "json", "--fail-on", "never")
    assert done.returncode == 0, done.stderr_text
    return [(Path(f["path"]).name, f["line"], f["code"]) for f in json.loads(done.stdout_text)["findings"]
            if f["code"] in codes]


def marked(folder: Path, mark: re.Pattern = BUG) -> set[tuple[str, int]]:
    """(file name, line) of every line of the folder's Python files that carries the marker."""
    return {(p.name, n) for p in sorted(folder.glob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if mark.search(line)}


def near(found: list[tuple[str, int, str]], lines: set[tuple[str, int]], slack: int = 3) -> bool:
    """Some finding sits within `slack` lines of a marked line of the same file (the eval's slack)."""
    return any((name, line + d) in lines for name, line, _code in found for d in range(-slack, slack + 1))

"""Three claims about when things run, in the shapes real projects use: a learning-rate scheduler stepped on every
accumulation micro-step (TD417), the only zero_grad() under a condition the optimizer step does not share (TD419),
and a model written on every rank through savers other than torch.save (TD303). Each shape is a folder with a `bad`
project (the line a diagnosis must name carries `# BUG`) and a `good` twin that must stay silent. `check` runs on
each folder as a real subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, cli

VARIANTS = FIXTURES / "check" / "variants"
CODES = {  # the rules that speak for each family
    "scheduler_micro_step": {"TD417"},
    "zero_grad_condition": {"TD410", "TD419"},
    "save_api_all_ranks": {"TD303"},
}
SHAPES = sorted((family, shape.name) for family in CODES for shape in (VARIANTS / family).iterdir() if shape.is_dir())


def _findings(folder: Path) -> list[dict]:
    done = cli("check", str(folder), "--format", "json", "--fail-on", "never")
    assert done.returncode == 0, done.stderr_text
    return json.loads(done.stdout_text)["findings"]


def _bug_lines(folder: Path) -> set[tuple[str, int]]:
    return {(p.name, n) for p in folder.glob("*.py")
            for n, line in enumerate(p.read_text().splitlines(), 1) if line.rstrip().endswith("# BUG")}


@pytest.mark.heavy  # two real `check` runs per shape, 16 shapes: about 45 s in all
@pytest.mark.parametrize(("family", "shape"), SHAPES)
def test_variant_is_found_and_its_twin_stays_silent(family: str, shape: str) -> None:
    bad, good = VARIANTS / family / shape / "bad", VARIANTS / family / shape / "good"
    marked = _bug_lines(bad)
    assert marked, "a bad variant marks its line with # BUG"
    hits = [f for f in _findings(bad) if f["code"] in CODES[family]]
    assert any((Path(f["path"]).name, line) in marked
               for f in hits for line in range(f["line"] - 3, f["line"] + 4)), hits
    assert not [f for f in _findings(good) if f["code"] in CODES[family]]

"""One bug in the shapes real projects write it in, each with its healthy twin (tests/fixtures/check/variants).

Every family folder holds one folder per shape (a plain script, a trainer class, `train()`/`evaluate()` functions
called from main.py, the model or loader in another file, an object chosen by config or argparse, names that say
nothing, and a few more per family); each shape has `bad/` with one `# BUG` line and `good/`, the same project with
the bug fixed. `check` runs on each folder as a project: the bad one must report the family's claim within three
lines of the `# BUG` line (the slack the realcode eval allows), the good one must not report it at all.
"""

from __future__ import annotations

import pytest

from tests.check_variants_support import VARIANTS, findings, marked, near, shapes

# The codes that make each family's claim.
CODES = {
    "softmax_into_cross_entropy": {"TD205", "TD604"},
    "log_of_zero": {"TD609", "TD611", "TD612", "TD604"},
    "host_sync_per_step": {"TD506", "TD507"},
    "loss_on_detached": {"TD805", "TD807", "TD808"},
}
# Cells no capability reaches yet: one element of the tuple a model class of another file returns, cut there.
MISSED = {
    ("loss_on_detached", "other_file"): "a model class of another file returns `h.detach()` in a tuple",
}
# Only this module's families: other variant modules keep their own folders (and markers) next to these.
SHAPES = shapes(CODES)


def test_every_family_has_its_shapes():
    for family in CODES:
        shapes = {s for f, s in SHAPES if f == family}
        assert {"script", "trainer", "functions", "other_file", "config", "opaque_names"} <= shapes, family


@pytest.mark.parametrize(("family", "shape"), SHAPES, ids=[f"{f}/{s}" for f, s in SHAPES])
def test_the_bad_project_is_found(family, shape, monkeypatch):
    if (family, shape) in MISSED:
        pytest.xfail(MISSED[(family, shape)])
    folder = VARIANTS / family / shape / "bad"
    lines = marked(folder)
    assert len(lines) == 1, f"{folder}: one `# BUG` line expected, found {lines}"
    found = findings(folder, monkeypatch, CODES[family])
    assert near(found, lines), (lines, found)


@pytest.mark.parametrize(("family", "shape"), SHAPES, ids=[f"{f}/{s}" for f, s in SHAPES])
def test_the_healthy_twin_is_silent(family, shape, monkeypatch):
    folder = VARIANTS / family / shape / "good"
    assert not list(folder.rglob("*.py")) or findings(folder, monkeypatch, CODES[family]) == []

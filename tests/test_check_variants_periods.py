"""The same three bugs (a shuffling DistributedSampler never given its epoch, a scheduler stepped at the wrong
period, zero_grad on every accumulation micro-step) in the shapes real projects use: a plain script, a trainer
class, train/evaluate functions called from main.py, the object built in another file, an object the command line
or a config picks, names that say nothing. Each shape is a folder with a `bad` project (the line a diagnosis must
name carries `# BUG`) and a `good` twin that must stay silent. `check` runs on each folder as a real subprocess."""

from __future__ import annotations

import pytest

from tests.check_variants_support import VARIANTS, findings_of_the_cli, marked, near, shapes

CODES = {  # the rules that speak for each family
    "sampler_set_epoch": {"TD301"},
    "scheduler_period": {"TD406", "TD407", "TD417"},
    "zero_grad_accumulation": {"TD413"},
}
SHAPES = shapes(CODES)


@pytest.mark.heavy  # two real `check` runs per shape, 19 shapes: about 50 s in all
@pytest.mark.parametrize(("family", "shape"), SHAPES)
def test_variant_is_found_and_its_twin_stays_silent(family: str, shape: str) -> None:
    bad, good = VARIANTS / family / shape / "bad", VARIANTS / family / shape / "good"
    lines = marked(bad)
    assert lines, "a bad variant marks its line with # BUG"
    hits = findings_of_the_cli(bad, CODES[family])
    assert near(hits, lines), hits
    assert not findings_of_the_cli(good, CODES[family])

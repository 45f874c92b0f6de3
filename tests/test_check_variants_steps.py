"""Three claims about when things run, in the shapes real projects use: a learning-rate scheduler stepped on every
accumulation micro-step (TD417), the only zero_grad() under a condition the optimizer step does not share (TD419),
and a model written on every rank through savers other than torch.save (TD303). Each shape is a folder with a `bad`
project (the line a diagnosis must name carries `# BUG`) and a `good` twin that must stay silent. `check` runs on
each folder as a real subprocess."""

from __future__ import annotations

import pytest

from tests.check_variants_support import VARIANTS, findings_of_the_cli, marked, near, shapes

CODES = {  # the rules that speak for each family
    "scheduler_micro_step": {"TD417"},
    "zero_grad_condition": {"TD410", "TD419"},
    "save_api_all_ranks": {"TD303"},
}
SHAPES = shapes(CODES)


@pytest.mark.heavy  # two real `check` runs per shape, 16 shapes: about 45 s in all
@pytest.mark.parametrize(("family", "shape"), SHAPES)
def test_variant_is_found_and_its_twin_stays_silent(family: str, shape: str) -> None:
    bad, good = VARIANTS / family / shape / "bad", VARIANTS / family / shape / "good"
    lines = marked(bad)
    assert lines, "a bad variant marks its line with # BUG"
    hits = findings_of_the_cli(bad, CODES[family])
    assert near(hits, lines), hits
    assert not findings_of_the_cli(good, CODES[family])

"""The protocol probes' parent-side analysis on recorded events: the judgement calls that no fixture
script needs a run for (which window is the accumulation, several losses of one forward, the curves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchdoctor.analysis.accumulation import analyse as analyse_accumulation
from torchdoctor.analysis.accumulation import usual_window
from torchdoctor.analysis.evidence import Outcome, RunEvidence
from torchdoctor.analysis.schedule import sparkline
from torchdoctor.rules import catalog

LIMITS = catalog.load_toml("thresholds.toml")


def _run(tmp_path: Path, *events: dict, probes: tuple[str, ...] = ("accumulation",)) -> RunEvidence:
    start = {"kind": "start", "step": 0, "t": 0.0, "world_size": 1}
    return RunEvidence(run_dir=tmp_path, cwd=str(tmp_path), target="train.py", project=str(tmp_path),
                       probes=list(probes), events={0: [start, *events]},
                       outcome=Outcome(stopped="completed", exit_code=0, signal=None, duration_s=1.0),
                       thresholds=LIMITS)


def _summary(**fields) -> dict:
    base = {"kind": "accumulation-summary", "probe": "accumulation", "step": 10, "t": 1.0, "sequence": [],
            "factors": [1.0, 1.0, 1.0], "norms": [], "alternations": 0, "reason": "completed"}
    return {**base, **fields}


@pytest.mark.parametrize(("hist", "k"), [
    ({4: 4, 6: 2}, 4),   # leftover windows merged into the next step are rarer than the usual one
    ({2: 6, 1: 8}, 2),   # a second phase without accumulation does not hide the first
    ({1: 30}, 1),
    ({4: 20, 2: 10}, 4),  # the partial window stepped at each epoch's end
    ({}, 0),
])
def test_usual_window(hist, k):
    assert usual_window(hist, 0.25) == k


def test_accumulation_judged_when_each_micro_step_has_its_forward(tmp_path):
    run = _run(tmp_path, _summary(histogram={"4": 10}, forwards={"4": 40}))
    found = analyse_accumulation(run)
    assert [s.id for s in found.symptoms] == ["accumulation-not-normalized"]
    assert found.symptoms[0].evidence[0].values["gradient_scale"] == 4.0


def test_two_losses_of_one_forward_are_not_accumulation(tmp_path):
    run = _run(tmp_path, _summary(histogram={"2": 10}, forwards={"2": 10}))  # 1 forward, 2 backward per step
    found = analyse_accumulation(run)
    assert found.symptoms == []
    assert "several losses of the same forward" in found.notes[0]


def test_divided_loss_and_optimizers_in_turn_are_not_flagged(tmp_path):
    assert analyse_accumulation(_run(tmp_path, _summary(histogram={"4": 10}, factors=[0.25] * 4))).symptoms == []
    alternating = analyse_accumulation(_run(tmp_path, _summary(histogram={"2": 10}, alternations=9)))
    assert alternating.symptoms == [] and "in turn" in alternating.notes[0]


def test_sparkline_shares_one_scale():
    assert sparkline([0.0, 0.5, 1.0], 0.0, 1.0) == "▁▅█"
    assert sparkline([0.1] * 5, 0.0, 1.0) == "▁▁▁▁▁"
    assert sparkline([1.0] * 3) == "▁▁▁"  # flat: the lowest bar
    assert len(sparkline(list(range(100)), width=32)) == 32

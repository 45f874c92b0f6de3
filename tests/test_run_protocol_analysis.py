"""The protocol probes' parent-side analysis on recorded events: the judgement calls that no fixture
script needs a run for (which window is the accumulation, several losses of one forward, the curves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchdoctor.analysis.accumulation import analyse as analyse_accumulation
from torchdoctor.analysis.accumulation import usual_window
from torchdoctor.analysis.evidence import Outcome, RunEvidence
from torchdoctor.analysis.schedule import analyse as analyse_schedule
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


def test_several_losses_of_one_batch_are_not_judged_as_undivided_accumulation(tmp_path):
    run = _run(tmp_path, _summary(histogram={"4": 10}, forwards={"4": 40}, same_input_windows={"4": 10}))
    found = analyse_accumulation(run)
    assert found.symptoms == []
    assert "same input batch" in found.notes[0]


def test_divided_loss_and_optimizers_in_turn_are_not_flagged(tmp_path):
    assert analyse_accumulation(_run(tmp_path, _summary(histogram={"4": 10}, factors=[0.25] * 4))).symptoms == []
    alternating = analyse_accumulation(_run(tmp_path, _summary(histogram={"2": 10}, alternations=9)))
    assert alternating.symptoms == [] and "in turn" in alternating.notes[0]


def test_sparkline_shares_one_scale():
    assert sparkline([0.0, 0.5, 1.0], 0.0, 1.0) == "▁▅█"
    assert sparkline([0.1] * 5, 0.0, 1.0) == "▁▁▁▁▁"
    assert sparkline([1.0] * 3) == "▁▁▁"  # flat: the lowest bar
    assert len(sparkline(list(range(100)), width=32)) == 32


# -- scheduler granularity: which recorded schedules are judged -------------------------------------------


def _schedule(tmp_path: Path, kind: str, length: int | None, steps: int, optimizer_steps: int, interval: int,
              stopped: str = "completed", **config) -> list[str]:
    """The ids the schedule analysis raises for one scheduler stepped `steps` times, every `interval`
    optimizer steps, over `optimizer_steps` (`length`: what the probe recorded as its planned length)."""
    created = {"kind": "scheduler", "probe": "schedule", "step": 0, "t": 0.1, "index": 1, "scheduler": kind,
               "length": length, "config": config, "optimizer": "SGD", "site": None}
    end = {"kind": "scheduler-end", "probe": "schedule", "step": optimizer_steps, "t": 1.0, "index": 1,
           "scheduler": kind, "steps": steps, "optimizer_steps": optimizer_steps, "child": False,
           "intervals": {str(interval): max(steps - 1, 1)}, "curve": [], "step_site": None}
    run = _run(tmp_path, created, end, probes=("schedule",))
    run.outcome = Outcome(stopped=stopped, exit_code=0, signal=None, duration_s=1.0)
    return [s.id for s in analyse_schedule(run).symptoms]


@pytest.mark.parametrize(("kind", "length", "steps", "optimizer_steps", "interval", "config"), [
    ("StepLR", 30, 3, 30, 10, {}),  # step_size=30 stepped per epoch, recorded as a length by older probes
    ("MultiStepLR", 60, 3, 30, 10, {"milestones": [30, 60]}),
    ("ExponentialLR", None, 3, 30, 10, {}),
    ("LambdaLR", None, 30, 30, 1, {}),  # a warm-up stepped per batch: its lambda has no length
    ("CosineAnnealingWarmRestarts", None, 30, 30, 1, {}),
    ("CosineAnnealingLR", 3, 3, 30, 10, {}),  # T_max=epochs, stepped per epoch
    ("CosineAnnealingLR", 100, 20, 1000, 50, {}),  # 100 epochs planned, early stopping after 20
    ("OneCycleLR", 4, 4, 40, 10, {}),  # sized in epochs (steps_per_epoch=1) and stepped per epoch
    ("MultiStepLR", None, 300, 300, 1, {"milestones": [100, 200], "last_milestone": 200}),  # iteration-based
])
def test_healthy_schedules_are_not_judged(tmp_path, kind, length, steps, optimizer_steps, interval, config):
    assert _schedule(tmp_path, kind, length, steps, optimizer_steps, interval, **config) == []


@pytest.mark.parametrize(("kind", "length", "steps", "optimizer_steps", "interval", "stopped", "config"), [
    ("OneCycleLR", 40, 4, 40, 10, "completed", {}),
    ("OneCycleLR", 400, 2, 25, 10, "steps", {}),  # projected: --steps 25 of a 400-step plan
    ("LinearLR", 500, 10, 1000, 100, "completed", {}),  # a warm-up sized in batches, stepped per epoch
    ("CosineAnnealingLR", 1000, 10, 1000, 100, "completed", {}),  # T_max=epochs*len(loader), per epoch
    ("CosineAnnealingLR", 3, 30, 30, 1, "completed", {}),  # T_max=epochs, stepped per batch
    ("MultiStepLR", None, 300, 300, 1, "completed", {"milestones": [10, 20], "last_milestone": 20}),
])
def test_mis_stepped_schedules_are_judged(tmp_path, kind, length, steps, optimizer_steps, interval, stopped, config):
    assert _schedule(tmp_path, kind, length, steps, optimizer_steps, interval, stopped, **config) == [
        "scheduler-granularity"]


def test_a_planned_schedule_is_not_judged_on_a_stopped_run_unless_documented_per_batch(tmp_path):
    assert _schedule(tmp_path, "CosineAnnealingLR", 1000, 2, 25, 10, "steps") == []
    # OneCycleLR sized in epochs: 25 optimizer steps are already far past its 4 planned steps
    assert _schedule(tmp_path, "OneCycleLR", 4, 2, 25, 10, "steps") == []

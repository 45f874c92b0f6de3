"""The training-protocol probes on real scripts: schedulers, AMP, accumulation, validation, checkpoints,
custom autograd Functions and gradient flow (issue 6).

Each buggy script (tests/fixtures/run/proto_*.py) really makes the mistake; `proto_healthy.py` makes
none of them (float16 with a scaler and unscale-then-clip, divided accumulation that steps the partial
window, OneCycleLR per optimizer step, no_grad + eval validation with train() restored, a complete
checkpoint and its resume, a correct custom Function, a deepcopy of the model, a bfloat16 loop without a
scaler) and must raise none of their symptoms, under every probe. One real `torchdoctor run` per
scenario, shared between the tests (and with test_run_protocol_merge.py).
"""

from __future__ import annotations

import csv
import os
import re

import pytest

from tests.test_run_support import assert_sound, shared_root, shared_run
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow

PROTOCOL = "schedule,amp,accumulation,validation,checkpoint,gradcheck,gradflow"
PROTOCOL_SYMPTOMS = {
    "scheduler-granularity", "scheduler-order", "fp16-without-scaler", "clip-before-unscale",
    "loss-scale-collapse", "scaler-with-bf16", "accumulation-not-normalized", "partial-accumulation-dropped",
    "eval-without-no-grad", "eval-mode-missing", "checkpoint-incomplete", "whole-model-pickled",
    "wrapped-state-dict-saved", "state-dict-mismatch", "unsafe-load", "bad-custom-backward", "frozen-parameters",
    "unused-parameters", "non-differentiable", "loss-not-decreasing",
}

# scenario -> (script, extra CLI arguments, expected exit code)
SCENARIOS = {
    "sched_epoch": ("proto_sched_epoch.py", (), exitcodes.FINDINGS),
    "sched_batch": ("proto_sched_batch.py", (), exitcodes.FINDINGS),
    "sched_ok": ("proto_sched_ok.py", (), exitcodes.OK),
    "sched_periodic": ("proto_sched_periodic.py", (), exitcodes.OK),
    "amp_fp16": ("proto_amp_fp16.py", (), exitcodes.FINDINGS),
    "amp_scaler": ("proto_amp_scaler.py", (), exitcodes.FINDINGS),
    "accum_bad": ("proto_accum_bad.py", (), exitcodes.OK),  # a warning and an info: below --fail-on error
    "eval_bad": ("proto_eval_bad.py", (), exitcodes.OK),
    "eval_restore": ("proto_eval_restore.py", (), exitcodes.OK),
    "fn_bad": ("proto_fn_bad.py", (), exitcodes.FINDINGS),
    # gradcheck spends ~5 s after the run on its first Function: far past the hang timeout
    "fn_many": ("proto_fn_many.py", ("--hang-timeout", "2"), exitcodes.OK),
    "flow_bad": ("proto_flow_bad.py", (), exitcodes.FINDINGS),
    "flow_constant": ("proto_flow_constant.py", (), exitcodes.OK),
}


def protocol_run(tmp_path_factory, name: str):
    """One scenario under the protocol probes (the static check included), run once per session."""
    script, extra, _ = SCENARIOS[name]
    return shared_run(tmp_path_factory, f"proto-{name}", script, "--probe", PROTOCOL, *extra)


def checkpoint_run(tmp_path_factory):
    """proto_ckpt_bad.py, given a directory to write and a checkpoint 'from elsewhere' to load."""
    torch = pytest.importorskip("torch")
    root = shared_root(tmp_path_factory)
    out = root / "proto-ckpt-out"
    out.mkdir(exist_ok=True)
    downloaded = root / "downloaded.pt"
    if not downloaded.exists():
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        tmp = root / f"downloaded.{os.getpid()}.tmp"
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, downloaded)
    return shared_run(tmp_path_factory, "proto-ckpt_bad", "proto_ckpt_bad.py", "--probe", PROTOCOL, "--",
                      str(out), str(downloaded))


def healthy_run(tmp_path_factory):
    """proto_healthy.py under every probe (the default set): none may disturb it, ours may raise nothing."""
    out = shared_root(tmp_path_factory) / "proto-healthy-out"
    out.mkdir(exist_ok=True)
    return shared_run(tmp_path_factory, "proto-healthy", "proto_healthy.py", "--fail-on", "never", "--", str(out))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = protocol_run(tmp_path_factory, name)
        return cache[name]

    return get


def one(result, symptom_id: str) -> dict:
    found = result.symptoms(symptom_id)
    assert len(found) == 1, [s["id"] for s in result.report["symptoms"]]
    return found[0]


def probe_values(symptom: dict) -> dict:
    return next(e["values"] for e in symptom["evidence"] if e["kind"] == "probe")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_runs_soundly(runs, name, validate_report):
    assert_sound(runs(name), validate_report, SCENARIOS[name][2])


# -- schedulers -----------------------------------------------------------------------------------


def test_per_batch_schedule_stepped_per_epoch(runs):
    result = runs("sched_epoch")
    symptom = one(result, "scheduler-granularity")
    assert symptom["location"]["line"] == 19 and symptom["location"]["code"] == "scheduler.step()"
    values = probe_values(symptom)
    assert values["scheduler"] == "OneCycleLR" and values["lr_steps_planned"] == 40
    assert values["lr_steps_taken"] == 4 and values["optimizer_steps_per_scheduler_step"] == 10
    assert values["used_fraction"] == pytest.approx(0.1) and values["projected"] is False
    curve = next(e for e in symptom["evidence"] if "lr_curve_intended" in e["values"])
    intended, projected = curve["values"]["lr_curve_intended"], curve["values"]["lr_curve_projected"]
    assert "█" in intended and "█" not in projected  # the run never reaches the peak it planned
    with open(result.report["artifacts"]["lr_curves"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 41 and rows[0]["scheduler"] == "1"
    peak = max(rows, key=lambda r: float(r["intended_lr"]))
    assert float(peak["intended_lr"]) == pytest.approx(0.1) and float(peak["projected_lr"]) < 0.05


def test_per_epoch_schedule_stepped_per_batch_and_before_the_optimizer(runs):
    result = runs("sched_batch")
    values = probe_values(one(result, "scheduler-granularity"))
    assert values["scheduler"] == "CosineAnnealingLR" and values["stepped_per"] == "batch"
    assert values["lr_steps_planned"] == 3 and values["lr_steps_taken"] == 30 and values["overrun"] == 10.0
    order = one(result, "scheduler-order")
    assert order["location"]["line"] == 19 and order["step"] == 0
    assert probe_values(order)["optimizer_steps_before"] == 0
    summary = next(e["summary"] for e in order["evidence"] if e["kind"] == "probe")
    assert summary.startswith("CosineAnnealingLR.step() ran before its optimizer had taken a single step")


# -- mixed precision --------------------------------------------------------------------------------


def test_fp16_backward_without_a_scaler(runs):
    result = runs("amp_fp16")
    symptom = one(result, "fp16-without-scaler")
    assert symptom["location"]["line"] == 15 and symptom["location"]["code"] == "loss.backward()"
    values = probe_values(symptom)
    assert values["backwards"] == 12 and values["device"] == "cpu"
    assert "amp" in result.report["contexts"]
    assert result.run["measurements"]["amp"]["autocast_regions"] == ["cpu float16 ×12"]


def test_clip_before_unscale_and_a_scaler_with_bf16(runs):
    result = runs("amp_scaler")
    clip = one(result, "clip-before-unscale")
    assert clip["location"]["line"] == 17
    values = probe_values(clip)
    assert values["scale"] == 65536.0 and values["max_norm"] == 1.0 and values["clips"] == 12
    assert values["clipped_norm"] == pytest.approx(values["scale"] * values["true_norm"], rel=1e-4)
    bf16 = one(result, "scaler-with-bf16")
    assert bf16["location"]["line"] == 16 and probe_values(bf16)["bf16_regions"] >= 1


def test_loss_scale_collapse_without_the_nan_probe(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "proto-amp_collapse", "proto_amp_collapse.py", "--probe", "amp")
    assert_sound(result, validate_report, exitcodes.FINDINGS)
    values = probe_values(one(result, "loss-scale-collapse"))
    assert values["scale"] < 1 and values["skipped_steps"] == values["steps"] == 24
    assert values["first_successful_step"] is None


# -- accumulation -----------------------------------------------------------------------------------


def test_accumulated_loss_not_divided(runs):
    symptom = one(runs("accum_bad"), "accumulation-not-normalized")
    assert symptom["location"]["line"] == 18 and symptom["location"]["code"] == "loss.backward()"
    values = probe_values(symptom)
    assert values["micro_steps"] == 4 and values["loss_factor"] == 1.0 and values["gradient_scale"] == 4.0
    assert 1.0 < values["grad_norm_growth"] <= 4.0  # the accumulated gradient grows with the micro-steps


def test_trailing_partial_window(runs):
    values = probe_values(one(runs("accum_bad"), "partial-accumulation-dropped"))
    assert values["dropped_micro_steps"] == 2 and values["micro_steps"] == 4
    assert values["merged_steps"] == [3, 5]  # the first step of epochs 2 and 3 summed 6 micro-steps
    assert values["dropped_at_end"] == 2


# -- validation -------------------------------------------------------------------------------------


def test_validation_with_grad_and_in_train_mode(runs):
    result = runs("eval_bad")
    no_grad = one(result, "eval-without-no-grad")
    assert no_grad["location"]["line"] == 18 and no_grad["location"]["code"] == "logits = model(x)"
    values = probe_values(no_grad)
    assert values["forwards"] == 6 and values["extra_gib"] > 0  # 3 epochs × 2 validation batches
    mode = probe_values(one(result, "eval-mode-missing"))
    assert mode["modules"] == ["1 (BatchNorm1d)", "3 (Dropout)"] and mode["forwards"] == 6
    assert "train_not_restored" not in mode
    assert "eval" in result.report["contexts"]


def test_train_mode_not_restored(runs):
    result = runs("eval_restore")
    values = probe_values(one(result, "eval-mode-missing"))
    assert values["train_not_restored"] is True and values["resumed_at_step"] == 4
    assert not result.symptoms("eval-without-no-grad")  # evaluate() runs under no_grad


# -- checkpoints ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return checkpoint_run(tmp_path_factory)


def test_checkpoint_runs_soundly(ckpt, validate_report):
    assert_sound(ckpt, validate_report, exitcodes.FINDINGS)


def test_incomplete_checkpoint(ckpt):
    symptom = one(ckpt, "checkpoint-incomplete")
    assert symptom["location"]["line"] == 27
    values = probe_values(symptom)
    assert values["saved"] == ["model"] and values["saves"] == 2  # the last epoch's save is after the last step
    assert values["missing"] == ["optimizer", "scheduler", "epoch", "rng"]


def test_whole_module_pickled_and_wrapped_keys(ckpt):
    whole = one(ckpt, "whole-model-pickled")
    assert whole["location"]["line"] == 29 and probe_values(whole)["modules"] == ["Sequential"]
    wrapped = one(ckpt, "wrapped-state-dict-saved")
    assert wrapped["location"]["line"] == 30 and probe_values(wrapped)["prefix"] == "module."


def test_unsafe_load_and_ignored_mismatch(ckpt):
    load = one(ckpt, "unsafe-load")
    assert load["location"]["line"] == 32 and probe_values(load)["weights_only"] is False
    mismatch = probe_values(one(ckpt, "state-dict-mismatch"))
    assert mismatch["missing_keys"] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert mismatch["unexpected_keys"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert mismatch["missing_count"] == mismatch["model_keys"] == 4  # a count; `missing` lists what a checkpoint lacks


# -- custom autograd Functions -------------------------------------------------------------------------


def test_bad_custom_backward_found_by_gradcheck(runs):
    result = runs("fn_bad")
    symptom = one(result, "bad-custom-backward")
    assert symptom["location"]["line"] == 18 and symptom["location"]["code"] == "def backward(ctx, grad):"
    values = probe_values(symptom)
    assert values["function"] == "Square" and values["input"] == "x" and values["input_index"] == 1
    assert values["max_abs_error"] > 0.1  # the missing factor 2: |2x - x| on the recorded inputs
    assert values["inputs"] == "the recorded values, in double precision"
    assert any("`Gated` was not checked, because argument 2 is a Gate" in n for n in result.report["notes"])
    measured = result.run["measurements"]["gradcheck"]
    assert measured["functions"] == 2 and measured["gradcheck_s"] >= 0
    assert "custom-autograd" in result.report["contexts"]


def test_functions_past_the_limit_are_named_not_passed(runs):
    result = runs("fn_many")
    measured = result.run["measurements"]["gradcheck"]
    assert measured["functions"] == 16 and measured["not_recorded"] == 2
    assert "2 more Functions not checked (past max_functions)" in measured["summary"]
    note = next(n for n in result.report["notes"] if n.startswith("gradcheck: 2 more"))
    assert "(`Scale15`, `Scale16`)" in note and "only the first 16 Functions" in note


def test_gradcheck_after_the_run_is_not_a_hang(runs):
    """--hang-timeout 2 while gradcheck checks a Function for ~5 s after the last step: the run completed."""
    result = runs("fn_many")
    assert result.run["stopped"] == "completed" and result.returncode == exitcodes.OK
    assert result.run["measurements"]["gradcheck"]["gradcheck_s"] > 2
    assert not result.symptoms("hang")


# -- gradient flow --------------------------------------------------------------------------------------


def test_graph_cut_and_parameters_without_gradients(runs):
    result = runs("flow_bad")
    cut = one(result, "non-differentiable")
    assert cut["location"]["line"] == 22
    values = probe_values(cut)
    assert values["parameters"] == ["encoder.weight", "encoder.bias"] and values["op"] == ".detach()"
    frozen = one(result, "frozen-parameters")
    causes = {e["values"]["cause"]: e["values"]["parameters"] for e in frozen["evidence"]}
    assert causes == {"not in any optimizer": ["gain"], "module never runs in the forward": ["aux.weight", "aux.bias"]}


def test_constant_loss(runs):
    values = probe_values(one(runs("flow_constant"), "loss-not-decreasing"))
    assert values["constant"] is True and values["samples"] == 15
    assert values["loss_first"] == values["loss_last"]
    # the measured line shows the loss as a person reads it, not every digit of a float
    summary = runs("flow_constant").run["measurements"]["gradflow"]["summary"]
    assert re.search(r"loss -?\d+(\.\d{1,3})?(e[-+]\d+)? → ", summary), summary


# -- the healthy twins ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return healthy_run(tmp_path_factory)


def test_healthy_protocol_raises_nothing_under_every_probe(healthy, validate_report):
    assert_sound(healthy, validate_report, exitcodes.OK)
    raised = {s["id"] for s in healthy.report["symptoms"]} & PROTOCOL_SYMPTOMS
    assert not raised, raised
    m = healthy.run["measurements"]
    assert m["accumulation"]["micro_steps_per_step"] == 2 and m["accumulation"]["loss_factor"] == 0.5
    assert m["amp"]["autocast_regions"][:2] == ["cpu float16 ×15", "cpu bfloat16 ×5"]
    assert m["checkpoint"]["restored"] == ["model", "optimizer", "scaler", "scheduler"]
    assert m["checkpoint"]["last_save_holds"] == ["model", "optimizer", "scheduler", "scaler", "epoch", "rng"]
    assert m["gradcheck"]["summary"].startswith("ScaledTanh: passed")
    assert m["validation"]["eval_grad"] == 0 and m["validation"]["eval_no_grad"] >= 4
    assert "ema" in healthy.stderr  # the deepcopy evaluated like the model (the script's stdout goes to stderr)


@pytest.mark.parametrize("name", ["sched_ok", "sched_periodic"])
def test_healthy_schedules_raise_nothing(runs, name):
    assert not {s["id"] for s in runs(name).report["symptoms"]} & PROTOCOL_SYMPTOMS


def test_periodic_schedules_have_no_planned_length(runs):
    """StepLR(step_size=30) per epoch over 30 optimizer steps once read as 'sized for 30, took 3' (exit 1)."""
    measured = runs("sched_periodic").run["measurements"]["schedule"]
    assert measured["schedulers"] == 6
    assert measured["summary"].startswith("StepLR (period 30 steps): 3 steps over 30 optimizer steps")
    assert "MultiStepLR: 3 steps" in measured["summary"]  # its last milestone is no planned length either

"""The nan probe on real scripts: the first bad module of a NaN, a NaN batch, backward-only NaNs,
exploding and vanishing gradients, GradScaler skips, and the same module as autograd's anomaly mode.

Each failing script has a healthy twin that must not raise its symptom. The
CUDA-only path (the sentinel read one step late) is tested on its events.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.test_run_support import RUN_FIXTURES, assert_sound, line_of, shared_run
from torchdoctor import exitcodes
from torchdoctor.analysis.evidence import Outcome, RunEvidence
from torchdoctor.analysis.nan import analyse
from torchdoctor.rules import catalog

pytestmark = pytest.mark.slow

NAN_IDS = ("nan-loss", "nonfinite-grad", "nonfinite-input", "exploding-gradients", "vanishing-gradients",
           "loss-scale-collapse")


def nan_run(tmp_path_factory, name: str, script: str):
    return shared_run(tmp_path_factory, f"nan-{name}", script, "--probe", "nan")


@pytest.fixture(scope="module")
def log_zero(tmp_path_factory):
    return nan_run(tmp_path_factory, "log-zero", "nan_log_zero.py")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    return nan_run(tmp_path_factory, "guarded", "nan_log_guarded.py")


@pytest.fixture(scope="module")
def nan_batch(tmp_path_factory):
    return nan_run(tmp_path_factory, "input", "nan_input.py")


@pytest.fixture(scope="module")
def backward_nan(tmp_path_factory):
    return nan_run(tmp_path_factory, "grad", "nan_grad_norm.py")


@pytest.fixture(scope="module")
def exploding(tmp_path_factory):
    return nan_run(tmp_path_factory, "exploding", "exploding_mlp.py")


@pytest.fixture(scope="module")
def vanishing(tmp_path_factory):
    return nan_run(tmp_path_factory, "vanishing", "vanishing_sigmoid.py")


@pytest.fixture(scope="module")
def scaler_ok(tmp_path_factory):
    return nan_run(tmp_path_factory, "scaler-ok", "scaler_healthy.py")


@pytest.fixture(scope="module")
def scaler_collapse(tmp_path_factory):
    return nan_run(tmp_path_factory, "scaler-collapse", "scaler_collapse.py")


def test_log_of_zero_names_the_first_bad_module_and_line(log_zero, validate_report):
    assert_sound(log_zero, validate_report, exitcodes.FINDINGS)  # nan-loss is an error
    [symptom] = log_zero.symptoms("nan-loss")
    values = symptom["evidence"][0]["values"]
    assert values["first_bad_module"] == "model.log_features" and values["module_type"] == "LogFeatures"
    assert values["phase"] == "forward" and values["op"] == "torch.log"
    assert values["step"] == 4 and symptom["step"] == 4  # sample 100 is in the 4th batch of 32
    assert values["lr"] == pytest.approx(0.05) and values["loss_value"] == "nan"
    assert symptom["location"]["path"] == "nan_log_zero.py"
    assert symptom["location"]["line"] == line_of("nan_log_zero.py", "return torch.log(x)")
    assert symptom["specialist"] == "debugging" and log_zero.report["route"][0]["specialist"] == "debugging"
    # the NaN gradients that follow are the same failure, not a second diagnosis
    assert not log_zero.symptoms("nonfinite-grad") and not log_zero.symptoms("nonfinite-input")
    assert "model.log_features" in log_zero.report["reports"][0]["diagnosis"]


def test_guarded_twin_raises_nothing(guarded, validate_report):
    assert_sound(guarded, validate_report, exitcodes.OK)
    assert not [s for s in guarded.report["symptoms"] if s["id"] in NAN_IDS]
    m = guarded.run["measurements"]["nan"]
    assert m["grad_checks"] == 8 and m["nonfinite_loss_steps"] == 0 and m["nonfinite_grad_steps"] == 0
    assert m["loss_first"] > 0 and m["grad_norm_median"] > 0


def test_a_nan_in_the_batch_is_the_datas_fault(nan_batch, validate_report):
    assert_sound(nan_batch, validate_report, exitcodes.FINDINGS)
    [symptom] = nan_batch.symptoms("nonfinite-input")
    values = symptom["evidence"][0]["values"]
    assert values["field"] == "batch[0]" and values["nonfinite_count"] == 1
    assert values["batch_index"] == 2 and values["step"] == 3  # sample 70 in the 3rd batch of 32
    assert values["model"] == "model" and values["model_input"] == "args[0]"
    assert symptom["location"]["line"] == line_of("nan_input.py", "loader = DataLoader(")
    assert not nan_batch.symptoms("nan-loss")


def test_backward_only_nan_names_the_module_whose_backward_made_it(backward_nan, validate_report):
    assert_sound(backward_nan, validate_report, exitcodes.FINDINGS)
    [symptom] = backward_nan.symptoms("nonfinite-grad")
    values = symptom["evidence"][0]["values"]
    assert values["first_bad_module"] == "model.magnitude" and values["phase"] == "backward"
    assert values["op"] == "torch.sqrt" and values["parameter"] == "model.embed.weight"
    assert values["step"] == 3
    assert symptom["location"]["line"] == line_of("nan_grad_norm.py", "torch.sqrt((h * h)")
    # the next loss is NaN because the update wrote NaN: evidence on the same symptom, not a nan-loss
    assert not backward_nan.symptoms("nan-loss")
    assert any("step 4" in e["summary"] for e in symptom["evidence"][1:])


def test_same_line_as_anomaly_mode_without_its_cost(backward_nan):
    """autograd's anomaly mode, on the same script, blames the forward line our replay names."""
    code = ("import runpy, sys, torch; torch.autograd.set_detect_anomaly(True); "
            "sys.argv = ['nan_grad_norm.py']; runpy.run_path('nan_grad_norm.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=RUN_FIXTURES,
                          timeout=120)
    assert "returned nan values" in proc.stderr
    forward = proc.stderr.split("Traceback of forward call", 1)[1].split("(Triggered internally", 1)[0]
    anomaly_line = int(re.findall(r'nan_grad_norm\.py", line (\d+)', forward)[-1])
    ours = backward_nan.symptoms("nonfinite-grad")[0]
    assert ours["location"]["line"] == anomaly_line
    assert ours["evidence"][0]["values"]["localisation_ms"] < 5000


def test_exploding_gradients_then_the_overflow(exploding, validate_report):
    assert_sound(exploding, validate_report, exitcodes.FINDINGS)
    [symptom] = exploding.symptoms("exploding-gradients")
    values = symptom["evidence"][0]["values"]
    assert values["grad_norm_growth"] >= 1000 and values["grad_norm"] > 1e3
    assert values["step"] >= 4 and values["lr"] == pytest.approx(2.0)
    assert values["layer"].startswith("model.") and values["grad_norm_ratio"] > 0
    [loss] = exploding.symptoms("nan-loss")  # the weights overflow a few steps later
    assert loss["evidence"][0]["values"]["after_exploding_gradients"] is True
    assert loss["step"] > symptom["step"]


def test_vanishing_gradients_in_a_deep_sigmoid_stack(vanishing, validate_report):
    assert_sound(vanishing, validate_report, exitcodes.OK)  # a warning: --fail-on error passes
    [symptom] = vanishing.symptoms("vanishing-gradients")
    values = symptom["evidence"][0]["values"]
    assert values["grad_norm_ratio"] < 1e-6 and values["layer"] == "model.0" and values["last_layer"] == "model.20"
    assert values["layers"] == 11 and values["steps_observed"] >= 3
    assert not vanishing.symptoms("exploding-gradients") and not vanishing.symptoms("nan-loss")


def test_occasional_scaler_skips_are_normal(scaler_ok, validate_report):
    assert_sound(scaler_ok, validate_report, exitcodes.OK)
    assert not [s for s in scaler_ok.report["symptoms"] if s["id"] in NAN_IDS]
    m = scaler_ok.run["measurements"]["nan"]
    assert 1 <= m["skipped_steps"] <= 8 and m["loss_scale"] >= 1
    assert "amp" in scaler_ok.report["contexts"]


def test_a_collapsing_scale(scaler_collapse, validate_report):
    assert_sound(scaler_collapse, validate_report, exitcodes.FINDINGS)
    [symptom] = scaler_collapse.symptoms("loss-scale-collapse")
    values = symptom["evidence"][0]["values"]
    assert values["scale"] < 1 and values["skipped_steps"] >= 30 and values["max_consecutive_skips"] >= 30
    assert values["first_bad_module"] == "model.0"
    [loss] = scaler_collapse.symptoms("nan-loss")
    assert loss["evidence"][0]["values"]["under_scaler"] is True
    assert loss["location"]["line"] == line_of("scaler_collapse.py", "/ x.std(0)")


# -- the analysis on recorded events ---------------------------------------------------------------------


def _evidence(tmp_path, events: list[dict], steps: int = 0) -> RunEvidence:
    rows = [{"kind": "start", "pid": 1, "world_size": 1, "t": 0.0, "step": 0}, *events]
    rows += [{"kind": "step", "step": s, "t": s * 0.1} for s in range(1, steps + 1)]
    return RunEvidence(run_dir=tmp_path, cwd=str(tmp_path), target="train.py", project=str(tmp_path),
                       probes=["nan"], events={0: rows}, outcome=Outcome("completed", 0, None, 1.0),
                       thresholds=catalog.load_toml("thresholds.toml"))


def test_cuda_late_sentinel_reports_the_step_without_a_module(tmp_path):
    """On CUDA the first non-finite loss is read one step late: reported, and said to be unlocalised."""
    event = {"kind": "nonfinite", "probe": "nan", "step": 7, "what": "loss", "at_step": 7, "module": None,
             "detected_late": True, "lr": 0.1, "t": 1.0,
             "unlocalised": "on CUDA the sentinel is read one step late, after the update; the next occurrence "
                            "is localised"}
    found = analyse(_evidence(tmp_path, [event], steps=9))
    [symptom] = found.symptoms
    assert symptom.id == "nan-loss" and symptom.step == 7
    assert symptom.evidence[0].values["detected_late"] is True and "one step late" in symptom.evidence[0].summary
    assert any("not localised" in n for n in found.notes)


@pytest.mark.parametrize(("skips", "scale", "steps", "raised"), [
    (3, 32768.0, 37, False),  # calibration skips, then healthy
    (12, 16.0, 30, True),  # 12 in a row after the first step
    (20, 0.5, 5, True),  # the scale fell below 1
])
def test_scale_collapse_thresholds(tmp_path, skips, scale, steps, raised):
    events = [{"kind": "scaler-skip", "probe": "nan", "skipped": i + 1, "streak": i + 1, "scale": scale,
               "after_first_step": True, "t": 0.5, "step": 1} for i in range(skips)]
    events.append({"kind": "nan-summary", "probe": "nan", "scaler": True, "loss_scale": scale, "skipped_steps": skips,
                   "max_consecutive_skips": skips, "t": 2.0, "step": steps})
    found = analyse(_evidence(tmp_path, events, steps=steps))
    assert any(s.id == "loss-scale-collapse" for s in found.symptoms) is raised
    assert "amp" in found.contexts


def test_noisy_but_bounded_gradient_norms_are_not_exploding(tmp_path):
    norms = [1.0, 3.0, 0.5, 40.0, 2.0, 90.0, 1.5, 0.2, 60.0, 5.0]  # spiky, within two orders of magnitude
    rows = [{"kind": "step", "step": i + 1, "t": 0.1 * (i + 1), "nan": {"grad_norm": n}} for i, n in enumerate(norms)]
    run = _evidence(tmp_path, [])
    run.events[0] += rows
    assert not [s for s in analyse(run).symptoms if s.id == "exploding-gradients"]

"""The profile probe on real scripts: .item() every step (host-sync at its line), many tiny ops
(launch-bound), Python work in the loop (slow-step), a slow __getitem__ (dataloader-bound from the
window), and a healthy loop that raises none of them; the trace file; CUDA-only symptoms on events."""

from __future__ import annotations

import json
import os

import pytest

from tests.test_run_support import RUN_FIXTURES, assert_sound, line_of, shared_run
from torchdoctor import exitcodes
from torchdoctor.analysis.evidence import Outcome, RunEvidence
from torchdoctor.analysis.profile import analyse, split
from torchdoctor.rules import catalog

pytestmark = pytest.mark.slow

PROFILE_IDS = ("dataloader-bound", "host-sync", "low-gpu-util", "launch-bound", "slow-step")


def profiled(tmp_path_factory, name: str, script: str):
    return shared_run(tmp_path_factory, f"profile-{name}", script, "--probe", "profile")


@pytest.fixture(scope="module")
def item(tmp_path_factory):
    return profiled(tmp_path_factory, "item", "item_every_step.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return profiled(tmp_path_factory, "tiny", "tiny_ops.py")


@pytest.fixture(scope="module")
def python_loop(tmp_path_factory):
    return profiled(tmp_path_factory, "python", "python_heavy_loop.py")


@pytest.fixture(scope="module")
def slow_data(tmp_path_factory):
    return profiled(tmp_path_factory, "data", "slow_getitem.py")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return profiled(tmp_path_factory, "healthy", "healthy_compute.py")


def test_item_every_step_is_a_host_sync_at_its_line(item, validate_report):
    assert_sound(item, validate_report, exitcodes.OK)
    [symptom] = item.symptoms("host-sync")
    values = symptom["evidence"][0]["values"]
    assert values["syncs_per_step"] == pytest.approx(1.0) and values["call"] == ".item()"
    assert values["device"] == "cpu" and symptom["severity"] == "info"  # free on CPU, a stall on a GPU
    assert symptom["location"]["path"] == "item_every_step.py"
    assert symptom["location"]["line"] == line_of("item_every_step.py", "running += loss.item()")
    assert "mean loss" in item.stderr  # the script's own output (stdout goes to stderr with --format json)
    assert "USDT" not in item.stderr  # kineto's start/stop chatter is kept off the script's stderr


def test_the_window_and_its_trace(item):
    m = item.run["measurements"]["profile"]
    assert (m["from_step"], m["to_step"]) == (6, 10)
    fractions = [m[f"{p}_fraction"] for p in ("data", "forward", "backward", "optimizer", "other")]
    assert sum(fractions) == pytest.approx(1.0, abs=0.01) and m["forward_fraction"] > 0 and m["backward_fraction"] > 0
    assert m["top_op"].startswith("aten::") and m["top_ops"] and m["gpu_util"] == "not measured (no GPU)"
    assert m["process_cpu_percent"] > 0 and m["cpu_count"] >= 1
    trace = item.report["artifacts"]["trace"]
    path = trace if os.path.isabs(trace) else os.path.join(RUN_FIXTURES, trace)
    with open(path) as fh:
        events = json.load(fh)["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)


def test_many_tiny_ops_are_launch_bound(tiny, validate_report):
    assert_sound(tiny, validate_report, exitcodes.OK)
    [symptom] = tiny.symptoms("launch-bound")
    values = symptom["evidence"][0]["values"]
    assert values["kernels_per_step"] >= 450 and values["mean_kernel_us"] <= 15  # 150 layers, fwd + bwd
    assert values["device"] == "cpu"
    assert symptom["severity"] == "info"  # on a CPU the pace moves with the machine's load: information
    assert not tiny.symptoms("slow-step")


def test_python_work_in_the_loop_is_a_slow_step(python_loop, validate_report):
    assert_sound(python_loop, validate_report, exitcodes.OK)
    [symptom] = python_loop.symptoms("slow-step")
    values = symptom["evidence"][0]["values"]
    assert values["other_fraction"] >= 0.4 and values["other_ms"] >= 5
    assert values["step_ms"] > 0 and values["top_op"].startswith("aten::")
    assert symptom["severity"] == "info"  # a CPU run: the loop's Python time depends on the machine's load
    assert not python_loop.symptoms("launch-bound") and not python_loop.symptoms("host-sync")


def test_the_window_sees_a_data_bound_step(slow_data, validate_report):
    assert_sound(slow_data, validate_report, exitcodes.OK)
    [symptom] = slow_data.symptoms("dataloader-bound")
    values = symptom["evidence"][0]["values"]
    assert values["data_wait_fraction"] > 0.5 and values["data_fraction"] == values["data_wait_fraction"]
    assert symptom["evidence"][0]["source"] == "profile"


def test_a_healthy_loop_raises_none(healthy, validate_report):
    assert_sound(healthy, validate_report, exitcodes.OK)
    assert not [s for s in healthy.report["symptoms"] if s["id"] in PROFILE_IDS]
    m = healthy.run["measurements"]["profile"]
    assert m["forward_fraction"] + m["backward_fraction"] + m["optimizer_fraction"] > 0.6


def test_a_moduledict_model_called_part_by_part_has_its_forward_timed(tmp_path_factory, validate_report):
    run = profiled(tmp_path_factory, "moduledict", "healthy_moduledict.py")
    assert_sound(run, validate_report, exitcodes.OK)
    m = run.run["measurements"]["profile"]
    assert m["forward_fraction"] > 0.1, m  # was 0: the hooks sat on the container, which is never called
    assert not run.symptoms("slow-step")


# -- the analysis of a CUDA window, on the event the probe writes -------------------------------------


def _cuda_window(**fields) -> dict:
    event = {"kind": "profile", "probe": "profile", "step": 10, "t": 3.0, "from_step": 6, "to_step": 10, "steps": 5,
             "step_ms": 20.0, "data_ms": 1.0, "forward_ms": 2.0, "backward_ms": 3.0, "optimizer_ms": 1.0,
             "device": "cuda", "compiled": False, "top_op": "aten::mm", "ops_per_step": 900.0, "mean_op_us": 12.0,
             "kernels_per_step": 1400.0, "mean_kernel_us": 4.0, "gpu_busy_fraction": 0.28, "nvml_gpu_util": 0.31,
             "copies_per_step": 2.0, "runtime_syncs_per_step": 1.0, "sync_calls": [], "sync_calls_total": 0,
             "notes": []}
    event.update(fields)
    return event


def _analyse(tmp_path, event: dict):
    run = RunEvidence(run_dir=tmp_path, cwd=str(tmp_path), target="train.py", project=str(tmp_path),
                      probes=["profile", "data"], events={0: [{"kind": "start", "t": 0.0, "step": 0}, event]},
                      outcome=Outcome("completed", 0, None, 5.0), thresholds=catalog.load_toml("thresholds.toml"))
    return analyse(run)


def test_cuda_window_low_util_and_launch_bound(tmp_path):
    found = _analyse(tmp_path, _cuda_window())
    ids = {s.id for s in found.symptoms}
    assert ids == {"low-gpu-util", "launch-bound", "slow-step"}  # 13 ms of the 20 ms step is "other"
    low = next(s for s in found.symptoms if s.id == "low-gpu-util").evidence[0].values
    assert low["gpu_util"] == 0.28 and low["nvml_gpu_util"] == 0.31
    launch = next(s for s in found.symptoms if s.id == "launch-bound").evidence[0].values
    assert launch["kernels_per_step"] == 1400.0 and launch["mean_kernel_us"] == 4.0
    assert "gpu" in found.contexts


def test_cuda_window_busy_gpu_with_a_sync(tmp_path):
    sync = [{"call": ".item()", "path": str(tmp_path / "train.py"), "line": 12, "function": "<module>", "count": 5,
             "per_step": 1.0}]
    event = _cuda_window(gpu_busy_fraction=0.93, mean_kernel_us=180.0, kernels_per_step=300.0, forward_ms=6.0,
                         backward_ms=9.0, optimizer_ms=2.0, sync_calls=sync, sync_calls_total=5)
    found = _analyse(tmp_path, event)
    assert [s.id for s in found.symptoms] == ["host-sync"]
    host = found.symptoms[0]
    assert host.severity == "warning" and host.location.line == 12 and host.evidence[0].values["device"] == "cuda"


def test_split_keeps_the_remainder_as_other():
    parts = split({"step_ms": 10.0, "data_ms": 2.0, "forward_ms": 3.0, "backward_ms": 4.0, "optimizer_ms": 0.5})
    assert parts["other_ms"] == pytest.approx(0.5) and parts["data_fraction"] == pytest.approx(0.2)

"""The memory probe on real scripts: leaks that grow bytes or graphs, healthy twins, fit verdicts.

Every leak script has a healthy twin that must not raise the symptom. The
CUDA tests need a GPU and say so when skipped; the CUDA analysis is tested on
torch's data layout in test_run_analysis.py.
"""

from __future__ import annotations

import os

import pytest

from tests.test_run_support import assert_sound, shared_run
from torchdoctor import exitcodes

pytestmark = pytest.mark.slow

HEALTHY_PARAMS = 256 * 1024 + 1024 + 1024 * 768 + 768 + 768 * 10 + 10  # healthy.py's MLP
MIB = 2**20


@pytest.fixture(scope="module")
def leak(tmp_path_factory):
    return shared_run(tmp_path_factory, "leak", "leak_total_loss.py")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return shared_run(tmp_path_factory, "healthy", "healthy.py", "--gpu-memory", "10GiB")


@pytest.fixture(scope="module")
def healthy_small_budget(tmp_path_factory):
    return shared_run(tmp_path_factory, "healthy16", "healthy.py", "--gpu-memory", "16MiB", "--probe", "memory")


@pytest.fixture(scope="module")
def growing(tmp_path_factory):
    return shared_run(tmp_path_factory, "growing", "growing_list.py")


def test_total_loss_leak_is_named_with_its_line(leak, validate_report):
    assert_sound(leak, validate_report, exitcodes.FINDINGS)  # memory-growth is an error: --fail-on error
    growth = leak.symptoms("memory-growth")
    assert len(growth) == 1
    symptom = growth[0]
    assert symptom["severity"] == "error" and symptom["specialist"] == "memory"
    assert symptom["location"]["path"] == "leak_total_loss.py"
    assert symptom["location"]["line"] == 19 and symptom["location"]["code"] == "total_loss += loss"
    values = leak.values("memory-growth")
    assert values["variable"] == "total_loss"
    assert values["graph_nodes_growth_per_step"] >= 1  # AddBackward plus the step's own nodes
    assert values["graph_nodes_last"] > values["graph_nodes_first"]
    assert "slope_mib_per_step" not in values  # the bytes stay flat: found by the graph, not by RSS
    assert leak.report["route"][0]["specialist"] == "memory"
    assert "total_loss" in leak.report["reports"][0]["diagnosis"] or any(
        "total_loss" in f["title"] for f in leak.report["reports"][0]["fixes"]
    )


def test_healthy_twin_has_no_growth_and_fits(healthy, validate_report):
    assert_sound(healthy, validate_report, exitcodes.OK)
    assert not healthy.symptoms("memory-growth")
    assert not healthy.symptoms("high-memory")
    memory = healthy.run["measurements"]["memory"]
    assert memory["fits"] is True and "fits in 10.00 GiB" in memory["verdict"]
    # RSS settles by a few MiB in the first steps (allocator caches, the probe's own census): far from a leak
    assert abs(memory["rss_slope_mib_per_step"]) < 0.3


def test_peak_breakdown_matches_the_model(healthy):
    m = healthy.run["measurements"]["memory"]
    params_mib = HEALTHY_PARAMS * 4 / MIB
    assert m["parameters_gib"] * 1024 == pytest.approx(params_mib, rel=0.02)
    assert m["gradients_gib"] * 1024 == pytest.approx(params_mib, rel=0.02)
    assert m["optimizer_state_gib"] * 1024 == pytest.approx(2 * params_mib, rel=0.02)  # Adam: exp_avg, exp_avg_sq
    assert m["activations_gib"] > 0 and m["batch_size"] == 64 and m["estimated"] is True
    assert m["peak_gib"] == pytest.approx(
        m["parameters_gib"] + m["gradients_gib"] + m["optimizer_state_gib"] + m["activations_gib"], abs=1e-3
    )


def test_budget_verdict_does_not_fit(healthy_small_budget, validate_report):
    assert_sound(healthy_small_budget, validate_report, exitcodes.FINDINGS)
    high = healthy_small_budget.symptoms("high-memory")
    assert len(high) == 1 and high[0]["severity"] == "error"
    values = high[0]["evidence"][0]["values"]
    assert values["budget_gib"] == pytest.approx(16 / 1024)
    assert values["peak_gib"] > values["budget_gib"] and values["batch_size"] == 64
    assert "does not fit in 16.0 MiB" in high[0]["evidence"][0]["summary"]
    assert healthy_small_budget.run["probes"] == ["memory"]
    assert not healthy_small_budget.symptoms("memory-growth")


def test_growing_list_of_tensors(growing, validate_report):
    assert_sound(growing, validate_report, exitcodes.FINDINGS)
    values = growing.values("memory-growth")
    assert values["series"] == "rss"
    assert values["slope_mib_per_step"] == pytest.approx(2.0, rel=0.25)  # one 512×1024 float32 per step
    assert values["variable"] == "history" and values["holder_kind"] == "list"
    assert values["tensors_growth_per_step"] == pytest.approx(1.0, rel=0.1)
    assert values["tensor_shape"] == [512, 1024] and values["tensor_dtype"] == "float32"
    symptom = growing.symptoms("memory-growth")[0]
    assert symptom["location"]["line"] == 15 and symptom["location"]["code"].startswith("history.append(")


def test_probe_cost_is_recorded(healthy):
    m = healthy.run["measurements"]["memory"]
    assert m["scans"] >= 1 and m["censuses"] >= 1
    assert 0 < m["probe_us_per_step"] < 10_000


torch = pytest.importorskip("torch")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: a real CUDA OOM and memory snapshot")
def test_real_cuda_oom_with_snapshot(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "cuda_oom", "cuda_oom.py")
    assert_sound(result, validate_report, exitcodes.SCRIPT_FAILED)
    values = result.values("oom")
    assert values["device"] == "cuda" and values["total_gib"] > 0 and values["allocated_gib"] > 0
    oom = result.symptoms("oom")[0]
    assert oom["location"]["path"] == "cuda_oom.py" and oom["location"]["line"] == 12
    snapshot = result.report["artifacts"]["memory_snapshot"]
    assert os.path.getsize(snapshot) > 0
    assert "gpu" in result.report["contexts"]

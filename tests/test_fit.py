"""`torchdoctor fit`: the step of a real script run under fake tensors, its sizes checked against
exact arithmetic and against a real CPU run, and the command as a user meets it.

The comparison with a real GPU is bench/fit/eval_fit.py (truth recorded on an H100 in
bench/fit/data/truth.json); the allocator replay against the H100's own traces is
tests/test_fit_allocator.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor.fit.estimate import FitError, measure, peak_of

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).parent / "fixtures" / "fit"
CARD = {"name": "test", "bytes": 24 * 2**30, "major": 9, "minor": 0}


def _spec(name: str, *argv: str) -> dict:
    return {"script": str(FIXTURES / name), "argv": list(argv), "card": CARD, "steps": 2}


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchdoctor.cli", "fit", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def test_parameters_and_adamw_state_have_their_exact_sizes():
    step = measure(_spec("mlp_cuda.py"), 64, 300)
    params = (1024 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10) * 4
    rounded = params + 6 * 512  # each of the 6 tensors is one block rounded up to 512 B
    assert step.breakdown["parameters"] == pytest.approx(params, rel=0.02)
    assert step.breakdown["parameters"] <= rounded
    assert step.breakdown["optimizer_state"] == pytest.approx(2 * params, rel=0.02)  # exp_avg and exp_avg_sq
    assert step.result["optimizers"] == ["AdamW"] and step.batch == 64


@pytest.mark.heavy  # a real CPU training step against the fake one
def test_activations_match_what_autograd_saves_in_a_real_cpu_run(tmp_path):
    """The estimate's activations at the peak against the bytes a real CPU step saves for backward."""
    batch = 4096  # large enough that the peak is the end of the forward, activations all alive
    step = measure(_spec("mlp_cuda.py"), batch, 300)
    real = subprocess.run([sys.executable, "-c", f"""
import torch, torch.nn as nn
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
params = {{p.untyped_storage().data_ptr() for p in model.parameters()}}
saved = {{}}
def pack(t):
    st = t.untyped_storage()
    if st.data_ptr() not in params:
        saved[st.data_ptr()] = st.nbytes()
    return t
x = torch.randn({batch}, 1024)
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, 10, ({batch},)))
print(sum(saved.values()))
"""], capture_output=True, text=True, timeout=300)
    saved = int(real.stdout.strip())
    assert step.breakdown["activations"] == pytest.approx(saved, rel=0.25), (step.breakdown, saved)


def test_a_billion_parameter_model_is_never_materialised():
    step = measure({**_spec("big_model.py"), "steps": 2}, None, 300)
    weights = 18 * 8192 * 8192 * 4  # 4.8 GB of fp32
    assert step.breakdown["parameters"] == pytest.approx(weights, rel=0.01)
    assert step.result["max_rss_bytes"] < 1.5 * 2**30, step.result["max_rss_bytes"]


def test_peak_of_reads_the_live_set_at_the_highest_point():
    events = [("alloc", 0, 1000), ("alloc", 1, 4096), ("free", 1, 0), ("alloc", 2, 100)]
    peak, breakdown = peak_of(events, {"0": "parameter", "1": "activation"})
    assert peak == 1024 + 4096  # blocks of 512 B
    assert breakdown["parameters"] == 1024 and breakdown["activations"] == 4096 and breakdown["other"] == 0


def test_a_script_that_cannot_run_under_fake_tensors_names_its_line():
    with pytest.raises(FitError) as info:
        measure(_spec("blocked.py"), None, 300)
    assert "blocked.py:9" in str(info.value)


@pytest.mark.heavy  # a real CPU measurement (~5 s); the quick suite was at 603 s on a clean clone of stop 26 (budget 600)
def test_cli_hard_coded_cuda_script_gets_an_answer_per_card(validate_report):
    proc = _cli(str(FIXTURES / "mlp_cuda.py"), "--gpu", "3090", "--gpu", "10GB", "--no-what-if", "--format", "json",
                "--", "--batch-size", "32")
    assert proc.returncode == 0, proc.stderr
    report = validate_report(proc.stdout)  # the usual Report, its estimate in `fit`
    assert report["command"] == "fit" and report["target"].endswith("mlp_cuda.py")
    fit = report["fit"]
    assert [g["name"] for g in fit["gpus"]] == ["RTX-3090", "10 GB"]
    assert all(g["fits"] and g["max_batch_size"] > 32 for g in fit["gpus"])
    assert fit["batch_size"] == 32 and fit["batch_arg"] == "batch_size"
    assert set(fit["breakdown"]) >= {"parameters", "gradients", "optimizer_state", "activations", "other"}
    larger = fit["gpus"][0]["max_batch_size"] > fit["gpus"][1]["max_batch_size"]
    assert larger


def test_cli_bad_input_exits_2_or_4_with_one_line(tmp_path):
    proc = _cli(str(tmp_path / "missing.py"))
    assert proc.returncode == 2 and "no such script" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli(str(FIXTURES / "mlp_cuda.py"), "--gpu", "potato")
    assert proc.returncode == 2 and "unknown GPU" in proc.stderr
    proc = _cli(str(FIXTURES / "one_step.py"), "--no-what-if")
    assert proc.returncode == 4 and "1 optimizer step" in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli(str(FIXTURES / "blocked.py"), "--no-what-if")
    assert proc.returncode == 4 and "blocked.py:9" in proc.stderr


def test_a_cuda_oom_answer_offers_fit_on_the_card_that_ran_out():
    proc = subprocess.run([sys.executable, "-m", "torchdoctor.cli", "ask", "--format", "json",
                           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                           "capacity of 23.65 GiB of which 1.20 GiB is free."], capture_output=True, text=True, timeout=60)
    steps = [s for r in json.loads(proc.stdout)["reports"] for s in r["next_steps"]]
    assert any("torchdoctor fit" in s and "--gpu 24GB" in s for s in steps), steps


def test_largest_batch_takes_the_phase_that_runs_out_first():
    from torchdoctor.fit.estimate import Step, largest_batch

    gib = 2**30
    # The optimizer step peaks at 3 GiB whatever the batch; forward+backward at 1 GiB + 0.1 GiB per sample.
    a = Step(10, 3 * gib, 3 * gib, {}, {"forward_backward": 2 * gib, "optimizer": 3 * gib}, {})
    b = Step(20, 3 * gib, 3 * gib, {}, {"forward_backward": 3 * gib, "optimizer": 3 * gib}, {})
    assert largest_batch(a, b, 10 * gib) == 90  # (10 - 1) / 0.1: the total's flat slope would say "any batch"
    assert largest_batch(a, b, 2 * gib) == 0  # the step alone does not fit


@pytest.mark.heavy  # a real CPU measurement (~5 s); the quick suite was at 603 s on a clean clone of stop 26 (budget 600)
def test_the_usual_cuda_training_shape_is_measured_and_writes_nothing(tmp_path):
    spec = {**_spec("amp_checkpoint.py"), "cwd": str(tmp_path)}
    small, large = measure(spec, None, 300), measure(spec, 64, 300)
    assert small.batch == 16 and small.result["batch"]["arg"] == "bs"
    assert small.result["autocast"] == ["float16"] and small.result["optimizers"] == ["Adam"]
    params = sum(n * 4 for n in (3 * 32 * 9, 32, 32, 32, 4 * (32 * 32 * 9 + 32), 32 * 10 + 10))
    assert small.breakdown["parameters"] == pytest.approx(params, rel=0.2)  # blocks of 512 B on small tensors
    assert large.peak_allocated > small.peak_allocated  # the batch reached the step
    assert not list(tmp_path.iterdir())  # torch.save wrote nothing

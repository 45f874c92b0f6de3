"""The CUDA paths of `run`, analysed again from evidence an NVIDIA H100 recorded.

bench/gpu/run_paths.sh ran five scripts (bench/gpu/scripts/) under `torchdoctor run` on an
H100 80GB (torch 2.11.0+cu130, driver 580.159.04, 2026-11-25); their event and step files are
kept in tests/data/gpu_h100/. CI has no GPU, so this is where the CUDA-only analysis (the real
allocator's numbers, a real CUDA OOM message, NVML utilisation, host syncs on a device) is
tested. The analysis runs here on today's code, not the report the GPU machine printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor.analysis import analyse
from torchdoctor.analysis.evidence import Outcome, RunEvidence, read_events
from torchdoctor.rules import catalog

DATA = Path(__file__).parent / "data" / "gpu_h100"
ROOT = Path(__file__).resolve().parents[1]  # the runs were made from the repository root


def _analyse(name: str):
    run_dir = DATA / name
    recorded = json.loads((run_dir / "report.json").read_text())["run"]
    outcome = Outcome(recorded["stopped"], recorded["exit_code"], recorded["signal"], recorded["duration_s"])
    run = RunEvidence(run_dir=run_dir, cwd=str(ROOT), target=f"bench/gpu/scripts/{name}.py", project=str(ROOT),
                      probes=recorded["probes"], events=read_events(run_dir), outcome=outcome,
                      thresholds=catalog.load_toml("thresholds.toml"))
    return {s.id: s for s in analyse(run).symptoms}


def test_healthy_bf16_transformer_is_not_called_fragmented_or_slow():
    found = _analyse("healthy")
    # At the end 1.65 GiB of 2.15 GiB were reserved and idle: the freed step's blocks, cached.
    # At the peak reserved exceeded allocated by 18 %: no fragmentation.
    assert "fragmentation" not in found
    assert "memory-growth" not in found and "host-sync" not in found


@pytest.mark.parametrize(("name", "symptom"), [("oom", "oom"), ("leak", "memory-growth"), ("sync", "host-sync"),
                                                ("dataloader_bound", "dataloader-bound")])
def test_each_planted_problem_is_found_from_the_gpu_evidence(name, symptom):
    assert symptom in _analyse(name)


def test_the_real_cuda_oom_gives_the_allocator_numbers():
    oom = _analyse("oom")["oom"]
    values = {k: v for e in oom.evidence for k, v in e.values.items()}
    assert values["device"] == "cuda"
    assert values["allocated_gib"] == pytest.approx(56.2, abs=0.1)
    assert oom.location is not None and oom.location.line == 10


def test_the_leak_names_the_list_that_keeps_the_graphs():
    growth = _analyse("leak")["memory-growth"]
    assert growth.location is not None and growth.location.line == 14
    assert any(e.values.get("variable") == "losses" for e in growth.evidence)


def test_the_host_sync_names_the_item_call():
    sync = _analyse("sync")["host-sync"]
    assert sync.location is not None and sync.location.line == 14

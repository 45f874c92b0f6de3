"""Distributed runs: real torchrun, gloo, 2 ranks on CPU, under `torchdoctor run`.

Each scenario runs once per test session (shared across xdist workers with a
file lock, like tests/test_run_support.py) and several tests read it. Every
run checks the documented exit code, a report.json valid against the schema,
that no process of the job (torchrun's agent, the ranks, their waiters) is
left, and that no fixture file changed. Ports never collide: every launch is
single-node `--standalone`, where torchrun's store binds a free port itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.test_run_support import RUN_FIXTURES, RunResult, assert_sound, run_once, shared_root
from torchdoctor import exitcodes
from torchdoctor.analysis.evidence import read_events

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.heavy]

DISTRIBUTED_IDS = {"ddp-hang", "collective-mismatch", "rank-crashed", "unused-parameters", "sampler-epoch-not-set",
                   "save-on-all-ranks", "accumulation-without-no-sync", "expand-in-forward", "straggler", "nccl-error",
                   "ddp-ranks-diverged"}


def _fixture_hashes() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(RUN_FIXTURES.glob("ddp_*.py"))}


def dist_run(tmp_path_factory, name: str, *args: str) -> RunResult:
    """One run per session; `{scratch}` in args becomes a per-scenario scratch directory (checkpoints)."""
    root = shared_root(tmp_path_factory)
    scratch = root / f"scratch-{name}"
    saved = root / f"dist-{name}.result.json"
    with open(root / f"dist-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if saved.exists():
            return RunResult(**json.loads(saved.read_text()))
        scratch.mkdir(exist_ok=True)
        before = _fixture_hashes()
        result = run_once(root / f"run-dist-{name}", *(a.format(scratch=scratch) for a in args), timeout=90)
        after = _fixture_hashes()
        result.changed += [k for k in before if before[k] != after.get(k)]
        saved.write_text(json.dumps(asdict(result)))
        return result


def ids(result: RunResult) -> list[str]:
    return [s["id"] for s in result.report["symptoms"]]


def values(symptom: dict) -> dict:
    merged: dict = {}
    for ev in symptom["evidence"]:
        for k, v in ev["values"].items():
            merged.setdefault(k, v)
    return merged


# -- a healthy DDP script ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return dist_run(tmp_path_factory, "healthy", "-p", "distributed,memory,env", "--nproc-per-node", "2",
                    "ddp_healthy.py", "--", "{scratch}")


def test_healthy_ddp_run_completes_with_no_distributed_symptom(healthy, validate_report):
    assert_sound(healthy, validate_report, exitcodes.OK)
    run = healthy.run
    assert run["stopped"] == "completed" and run["exit_code"] == 0
    assert run["ranks"] == 2 and run["steps_completed"] == 12
    assert run["command"][:3] == ["torchrun", "--nproc-per-node", "2"] and "ddp_healthy.py" in run["command"]
    assert "distributed" in healthy.report["contexts"]
    for symptom in healthy.report["symptoms"]:
        # the torch 2.13 CPU build may abort a rank at exit (after training): then, and only then, an info
        if symptom["id"] == "rank-crashed":
            assert symptom["severity"] == "info" and values(symptom)["after_last_step"] is True
        else:
            assert symptom["id"] not in DISTRIBUTED_IDS, symptom


def test_healthy_ddp_run_has_per_rank_step_times(healthy):
    numbers = healthy.run["measurements"]["distributed"]
    assert numbers["world_size"] == 2 and numbers["backend"] == "gloo"
    ranks = {row["rank"]: row for row in numbers["ranks"]}
    assert set(ranks) == {0, 1}
    for row in ranks.values():
        assert row["steps"] == 12
        assert row["step_time_median_ms"] > 0 and row["local_time_median_ms"] > 0
        assert row["end"] in ("finished", "finished-then-died")
    assert "step time (median) rank 0" in numbers["summary"]


def test_every_rank_streams_its_own_evidence(healthy):
    run_dir = Path(healthy.run_dir)
    for rank in (0, 1):
        events = [json.loads(line) for line in (run_dir / f"events.rank{rank}.jsonl").read_text().splitlines()]
        start = next(e for e in events if e["kind"] == "start")
        assert start["rank"] == rank and start["world_size"] == 2 and start["host"]
        assert any(e["kind"] == "ddp-model" for e in events)
        assert events[-1]["kind"] == "process-exit"  # the rank's waiter recorded how its process ended
        assert events[-1]["code"] in (0, -6)


def test_only_rank_zero_saved_so_no_save_symptom(healthy):
    saves = {rank: [json.loads(line) for line in
                    (Path(healthy.run_dir) / f"events.rank{rank}.jsonl").read_text().splitlines()
                    if '"kind":"save"' in line] for rank in (0, 1)}
    assert len(saves[0]) == 3 and saves[1] == []  # one per epoch, on rank 0 only
    assert {s["line"] for s in saves[0]} == {40} and all(s["file"].endswith("healthy.pt") for s in saves[0])
    assert "save-on-all-ranks" not in ids(healthy)


# -- mismatched collectives: rank 0 in all_reduce, rank 1 in barrier -----------------------------


@pytest.fixture(scope="module")
def mismatch(tmp_path_factory):
    return dist_run(tmp_path_factory, "mismatch", "-p", "distributed", "--hang-timeout", "3", "--nproc-per-node",
                    "2", "ddp_mismatch.py", "--", "--stamp", "{scratch}/hang_began")


def test_mismatched_collectives_name_both_ranks_and_lines(mismatch, validate_report):
    assert_sound(mismatch, validate_report, exitcodes.SCRIPT_FAILED)
    assert mismatch.run["stopped"] == "hang" and mismatch.run["steps_completed"] == 3
    found = {s["rank"]: s for s in mismatch.report["symptoms"] if s["id"] == "collective-mismatch"}
    assert set(found) == {0, 1}
    assert (found[0]["location"]["line"], found[0]["location"]["code"]) == (32, "dist.all_reduce(total)")
    assert (found[1]["location"]["line"], found[1]["location"]["code"]) == (34, "dist.barrier()")
    assert values(found[0])["collective"] == "all_reduce" and values(found[1])["collective"] == "barrier"
    calls = values(found[0])["calls"]
    assert any("rank 0 waits in all_reduce at ddp_mismatch.py:32" in c for c in calls)
    assert any("rank 1 waits in barrier at ddp_mismatch.py:34" in c for c in calls)
    assert "hang" not in ids(mismatch)  # the distributed classification replaces the generic hang
    assert mismatch.report["route"][0]["specialist"] == "distributed"
    assert mismatch.report["artifacts"]["stacks"].endswith("stacks.rank0.txt")
    assert mismatch.report["artifacts"]["stacks.rank1"].endswith("stacks.rank1.txt")


def test_mismatch_is_named_within_the_hang_timeout_plus_15_seconds(mismatch, tmp_path_factory):
    began = float((shared_root(tmp_path_factory) / "scratch-mismatch" / "hang_began").read_text())
    reported = (Path(mismatch.run_dir) / "report.json").stat().st_mtime
    assert 3.0 <= reported - began <= 3.0 + 15.0


@pytest.fixture(scope="module")
def debugged(tmp_path_factory):
    return dist_run(tmp_path_factory, "ddp-debug", "-p", "distributed", "--ddp-debug", "--nproc-per-node", "2",
                    "ddp_mismatch.py", "--", "--no-ddp")


def test_ddp_debug_turns_detail_mismatch_errors_into_the_same_symptom(debugged, validate_report):
    assert_sound(debugged, validate_report, exitcodes.SCRIPT_FAILED)
    assert debugged.run["stopped"] == "crashed"  # DETAIL raises at once instead of hanging
    found = {s["rank"]: s for s in debugged.report["symptoms"] if s["id"] == "collective-mismatch"}
    assert set(found) == {0, 1}
    assert values(found[0])["op_type"] == "ALLREDUCE" and values(found[0])["other_op_type"] == "BARRIER"
    assert values(found[1])["op_type"] == "BARRIER" and values(found[0])["seq_num"] == 0
    assert found[0]["location"]["line"] == 32 and found[1]["location"]["line"] == 34
    assert "rank-crashed" not in ids(debugged)  # the mismatch is the diagnosis, not a dead rank
    env = [json.loads(line) for line in (Path(debugged.run_dir) / "events.rank0.jsonl").read_text().splitlines()]
    assert "Detected mismatch between collectives" in next(e for e in env if e["kind"] == "exception")["message"]


# -- one rank raises mid-epoch -----------------------------------------------------------------


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    return dist_run(tmp_path_factory, "crash", "-p", "distributed", "--nproc-per-node", "2", "ddp_crash.py")


def test_the_rank_that_raised_is_named_with_its_error(crashed, validate_report):
    assert_sound(crashed, validate_report, exitcodes.SCRIPT_FAILED)
    run = crashed.run
    assert run["stopped"] == "crashed" and run["exit_code"] == 1
    assert run["error"]["type"] == "ValueError" and run["error"]["message"] == "corrupt sample in shard 1 at step 3"
    assert run["error"]["location"]["line"] == 10
    [symptom] = [s for s in crashed.report["symptoms"] if s["id"] == "rank-crashed"]
    assert symptom["rank"] == 1 and symptom["step"] == 3 and symptom["severity"] == "error"
    v = values(symptom)
    assert v["exit_code"] == 1 and v["error"] == "ValueError: corrupt sample in shard 1 at step 3"
    assert v["first_failure"] is True and v["after_last_step"] is False
    assert symptom["location"]["path"] == "ddp_crash.py" and symptom["location"]["line"] == 10
    assert any(ev["summary"].startswith("rank 0 then raised") for ev in symptom["evidence"])
    assert any("Rank 1 failed first" in note for note in crashed.report["notes"])


def test_nobody_waits_for_a_default_timeout_after_a_crash(crashed):
    assert crashed.run["duration_s"] < 25.0  # gloo's collective timeout is 30 min, torchrun's shutdown 30 s


@pytest.fixture(scope="module")
def peer_wait(tmp_path_factory):
    return dist_run(tmp_path_factory, "peer-wait", "-p", "distributed", "--nproc-per-node", "2",
                    "ddp_peer_wait.py")


def test_a_rank_left_waiting_for_a_dead_one_is_stopped_by_torchdoctor(peer_wait, validate_report):
    assert_sound(peer_wait, validate_report, exitcodes.SCRIPT_FAILED)
    [symptom] = [s for s in peer_wait.report["symptoms"] if s["id"] == "rank-crashed"]
    v = values(symptom)
    assert symptom["rank"] == 1 and v["error"] == "RuntimeError: rank 1 lost its data shard"
    assert v["waiting_ranks"] == [0]
    assert any(ev["summary"].startswith("rank 0 is stuck in time.sleep(0.1) at ddp_peer_wait.py:29")
               for ev in symptom["evidence"])
    assert peer_wait.report["artifacts"]["stacks"].endswith("stacks.rank0.txt")
    # torchrun's agent alone would wait 30 s for rank 0 after its SIGTERM (which rank 0 only notes)
    events = [json.loads(line) for line in (Path(peer_wait.run_dir) / "events.rank1.jsonl").read_text().splitlines()]
    start = events[0]
    failed_at = start["time"] + next(e for e in events if e["kind"] == "exception")["t"] - start["t"]
    assert (Path(peer_wait.run_dir) / "report.json").stat().st_mtime - failed_at < 20.0
    assert "rank 0: SIGTERM noted" in peer_wait.stderr


# -- the DDP run-time checks ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    """Through the user's own launcher line: `torchdoctor run -- torchrun …`."""
    return dist_run(tmp_path_factory, "mistakes", "-p", "distributed", "--", "torchrun", "--standalone",
                    "--nproc_per_node", "2", "ddp_mistakes.py", "{scratch}")


def test_the_users_own_torchrun_line_runs_every_rank_under_the_probes(mistakes, validate_report):
    assert_sound(mistakes, validate_report, exitcodes.OK)  # warnings and info only: below --fail-on error
    assert mistakes.run["stopped"] == "completed" and mistakes.run["ranks"] == 2
    assert mistakes.run["command"][:4] == ["torchrun", "--standalone", "--nproc_per_node", "2"]
    assert mistakes.run["command"][4] == "ddp_mistakes.py"
    for rank in (0, 1):
        assert (Path(mistakes.run_dir) / f"events.rank{rank}.jsonl").exists()


def test_sampler_epoch_never_set_is_observed(mistakes, healthy):
    [symptom] = [s for s in mistakes.report["symptoms"] if s["id"] == "sampler-epoch-not-set"]
    v = values(symptom)
    assert v["epochs"] == 2 and v["epoch"] == 0 and v["set_epoch_calls"] == 0 and v["ranks"] == [0, 1]
    assert symptom["location"]["line"] == 41 and symptom["rank"] == 0
    assert "sampler-epoch-not-set" not in ids(healthy)


def test_save_on_every_rank(mistakes, healthy):
    [symptom] = [s for s in mistakes.report["symptoms"] if s["id"] == "save-on-all-ranks"]
    v = values(symptom)
    assert v["ranks_saving"] == 2 and v["same_file"] is True and v["path"].endswith("mistakes.pt")
    assert symptom["location"]["line"] == 49 and symptom["severity"] == "warning"
    assert "save-on-all-ranks" not in ids(healthy)


def test_accumulation_without_no_sync(mistakes, healthy):
    [symptom] = [s for s in mistakes.report["symptoms"] if s["id"] == "accumulation-without-no-sync"]
    v = values(symptom)
    assert v["allreduces_per_step"] == 2 and v["micro_steps"] == 2 and v["steps"] == 10
    assert symptom["location"]["line"] == 44
    assert "accumulation-without-no-sync" not in ids(healthy)  # no_sync(): one sync per optimizer step
    rows = [e.get("distributed") for e in read_events(healthy.run_dir)[0] if e["kind"] == "step"]
    assert {(r["micro"], r["syncs"]) for r in rows} == {(2, 1)}


def test_expand_of_a_parameter_in_forward(mistakes, healthy):
    [symptom] = [s for s in mistakes.report["symptoms"] if s["id"] == "expand-in-forward"]
    assert symptom["severity"] == "info" and symptom["location"]["line"] == 27
    assert values(symptom)["parameters"] == ["scale"]
    assert "expand-in-forward" not in ids(healthy)


def test_straggler_is_the_slow_rank(mistakes, healthy):
    [symptom] = [s for s in mistakes.report["symptoms"] if s["id"] == "straggler"]
    v = values(symptom)
    assert symptom["rank"] == 1 and v["slowdown"] >= 1.3 and v["local_step_ms"] >= 20.0
    assert "straggler" not in ids(healthy)


def test_advice_for_each_check_reaches_the_distributed_specialist(mistakes):
    report = next(r for r in mistakes.report["reports"] if r["specialist"] == "distributed")
    assert "set_epoch" in report["diagnosis"] or any("set_epoch" in f["title"] for f in report["fixes"])


# -- unused parameters ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unused(tmp_path_factory):
    return dist_run(tmp_path_factory, "unused", "-p", "distributed", "--nproc-per-node", "2", "ddp_unused.py")


def test_unused_parameters_are_named_and_ddps_error_is_captured(unused, healthy, validate_report):
    assert_sound(unused, validate_report, exitcodes.SCRIPT_FAILED)
    found = {s["rank"]: s for s in unused.report["symptoms"] if s["id"] == "unused-parameters"}
    assert set(found) == {0, 1}
    for symptom in found.values():
        v = values(symptom)
        assert v["unused_parameters"] == ["aux_head.weight", "aux_head.bias"]
        assert v["find_unused_parameters"] is False and v["at_steps"] == [1]  # step numbers; `steps` is a count elsewhere
        sources = {ev["source"] for ev in symptom["evidence"]}
        assert sources == {"distributed", "ddp-unfinished-reduction"}  # the probe and DDP's own error, merged
    assert "Expected to have finished reduction" in unused.run["error"]["message"]
    assert "rank-crashed" not in ids(unused)  # every rank failed with DDP's error: no single rank died
    assert "unused-parameters" not in ids(healthy)


# -- a rank that aborts at exit after training ---------------------------------------------------


@pytest.fixture(scope="module")
def aborted(tmp_path_factory):
    return dist_run(tmp_path_factory, "abort", "-p", "distributed", "--nproc-per-node", "2",
                    "ddp_abort_at_exit.py")


def test_an_abort_after_the_last_step_is_a_completed_run_with_a_note(aborted, validate_report):
    assert_sound(aborted, validate_report, exitcodes.OK)  # never 4: every rank finished its work
    run = aborted.run
    assert run["stopped"] == "completed" and run["exit_code"] == 0 and run["signal"] == "SIGABRT"
    crashed = {s["rank"]: s for s in aborted.report["symptoms"] if s["id"] == "rank-crashed"}
    # rank 1 aborts on purpose; this torch CPU build sometimes aborts rank 0 at exit too ("terminate called
    # without an active exception"), which must read the same way: an info, after the last step
    assert 1 in crashed and set(crashed) <= {0, 1}
    assert all(s["severity"] == "info" and values(s)["after_last_step"] is True for s in crashed.values())
    symptom = crashed[1]
    v = values(symptom)
    assert v["after_last_step"] is True and v["signal"] == "SIGABRT" and v["exit_code"] == -6 and v["step"] == 6
    assert any("interpreter shutdown" in note for note in aborted.report["notes"])
    assert "rank 1 finished training" in aborted.stderr  # the script's own last output came before the abort
    report = next(r for r in aborted.report["reports"] if r["specialist"] == "distributed")
    assert "aborted at process exit" in report["diagnosis"]

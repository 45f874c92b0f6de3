"""The pieces of distributed runs that need no torchrun: launcher lines, rank ends, stack classification.

Pure Python and quick; the real torchrun jobs are in tests/test_run_distributed.py.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import cli
from torchdoctor import exitcodes
from torchdoctor.analysis import distributed
from torchdoctor.analysis.evidence import Outcome, RunEvidence
from torchdoctor.analysis.ranks import blocked_in, decide, first_failure, rank_end, remote_ranks
from torchdoctor.run_launch import (
    BOOTSTRAP,
    LaunchError,
    is_launcher_line,
    own_launch,
    parse_launcher_line,
)
from torchdoctor.run_options import RunRequest, UsageError, make_plan

SITE = sysconfig.get_paths()["purelib"]
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
LOGGER = f"{SITE}/torch/distributed/c10d_logger.py"


# -- launcher lines ----------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_a_torchrun_line_gets_the_bootstrap_in_place_of_the_script(project):
    line = ["torchrun", "--nproc_per_node", "2", "--standalone", "train.py", "--lr", "1e-3"]
    assert is_launcher_line(line, str(project))
    launch = parse_launcher_line(line, str(project))
    assert launch.options == ["--nproc_per_node", "2", "--standalone"]
    assert (launch.target, launch.args, launch.module) == ("train.py", ["--lr", "1e-3"], False)
    assert launch.argv() == [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                             "-m", BOOTSTRAP, "train.py", "--lr", "1e-3"]
    assert launch.typed == line


def test_python_m_torch_distributed_run_with_a_module_and_rendezvous(project):
    line = ["python3", "-m", "torch.distributed.run", "--nnodes=2", "--node-rank", "1", "--master-addr", "node0",
            "--master_port", "29500", "--nproc-per-node", "4", "-m", "pkg.train", "--epochs", "3"]
    assert is_launcher_line(line, str(project))
    launch = parse_launcher_line(line, str(project))
    assert launch.module and launch.target == "pkg.train" and launch.args == ["--epochs", "3"]
    assert "-m" not in launch.options and launch.node_rank == 1 and launch.option("--master-port") == "29500"
    tail = launch.argv()[launch.argv().index(BOOTSTRAP) - 1:]
    assert tail == ["-m", BOOTSTRAP, "-m", "pkg.train", "--epochs", "3"]


def test_abbreviated_and_unknown_options(project):
    launch = parse_launcher_line(["torchrun", "--nproc", "2", "--some-new-flag", "train.py"], str(project))
    assert launch.options == ["--nproc", "2", "--some-new-flag"] and launch.target == "train.py"


@pytest.mark.parametrize("line, message", [
    (["torchrun", "--no-python", "train.py"], "not Python"),
    (["torchrun", "--run-path", "train.py"], "--run-path"),
    (["torchrun", "--nproc-per-node", "2"], "no training script"),
])
def test_lines_the_bootstrap_cannot_enter(project, line, message):
    with pytest.raises(LaunchError, match=message):
        parse_launcher_line(line, str(project))


def test_what_is_not_a_launcher_line(project):
    assert not is_launcher_line(["train.py"], str(project))
    assert not is_launcher_line(["python", "train.py"], str(project))
    (project / "torchrun").write_text("")  # a script that happens to be called torchrun
    assert not is_launcher_line(["torchrun", "x"], str(project))


def test_own_launch_is_standalone_unless_a_rendezvous_is_given():
    assert own_launch("2", [], None, "train.py", ["--x"]).options == ["--nproc-per-node", "2", "--standalone"]
    multi = own_launch("8", ["--nnodes", "2", "--rdzv-endpoint", "h:1"], None, "train.py", [])
    assert "--standalone" not in multi.options
    assert multi.typed == ["torchrun", "--nproc-per-node", "8", "--nnodes", "2", "--rdzv-endpoint", "h:1", "train.py"]
    with pytest.raises(LaunchError):
        own_launch("0", [], None, "train.py", [])
    with pytest.raises(LaunchError):
        own_launch("two", [], None, "train.py", [])


def test_plans_of_distributed_runs(project):
    plan = make_plan(RunRequest(target=["train.py", "--a"], nproc_per_node="2", out=str(project / "out")),
                     cwd=str(project))
    assert plan.distributed and plan.child_config()["launcher"] == "torchrun"
    assert plan.user_command == ["torchrun", "--nproc-per-node", "2", "--standalone", "train.py", "--a"]
    own = make_plan(RunRequest(target=["torchrun", "--nproc_per_node", "2", "train.py"], out=str(project / "o2")),
                    cwd=str(project))
    assert own.script == "train.py" and own.user_command[0] == "torchrun"
    single = make_plan(RunRequest(target=["train.py"], out=str(project / "o3")), cwd=str(project))
    assert not single.distributed and "launcher" not in single.child_config()


@pytest.mark.parametrize("request_fields, message", [
    ({"target": ["train.py"], "ddp_debug": True}, "--ddp-debug needs a distributed run"),
    ({"target": ["train.py"], "rendezvous": ["--nnodes", "2"]}, "need --nproc-per-node"),
    ({"target": ["torchrun", "train.py"], "nproc_per_node": "2"}, "not both"),
    ({"target": ["torchrun", "--nproc-per-node", "2", "missing.py"]}, "no such script"),
])
def test_distributed_usage_errors_change_nothing(project, request_fields, message):
    with pytest.raises(UsageError, match=message):
        make_plan(RunRequest(out=str(project / "out"), **request_fields), cwd=str(project))
    assert not (project / "out").exists()


def test_usage_errors_from_the_cli(project):
    proc = cli("run", "--", "torchrun", "--no-python", "train.py", cwd=project)
    assert proc.returncode == exitcodes.USAGE and "not Python" in proc.stderr_text
    assert "Traceback" not in proc.stderr_text
    proc = cli("run", "--nproc-per-node", "many", "train.py", cwd=project)
    assert proc.returncode == exitcodes.USAGE and "--nproc-per-node 'many'" in proc.stderr_text
    assert sorted(p.name for p in project.iterdir()) == ["train.py"]


# -- how ranks ended -------------------------------------------------------------------------------


def _rank_events(rank: int, *tail: dict, steps: int = 3, t0: float = 1000.0) -> list[dict]:
    events = [{"kind": "start", "t": 0.0, "time": t0, "rank": rank, "world_size": 2, "pid": 100 + rank}]
    events += [{"kind": "step", "step": i + 1, "t": 0.1 * (i + 1)} for i in range(steps)]
    return events + list(tail)


def test_an_abort_at_exit_and_its_aftermath_are_a_completed_run():
    ends = {
        0: rank_end(0, _rank_events(0, {"kind": "exit", "reason": "terminated", "code": 143, "t": 2.0},
                                    {"kind": "process-exit", "code": 143, "signal": None, "time": 1002.1})),
        1: rank_end(1, _rank_events(1, {"kind": "exit", "reason": "completed", "code": 0, "t": 1.0},
                                    {"kind": "process-exit", "code": -6, "signal": "SIGABRT", "time": 1001.5})),
    }
    assert ends[1].kind == "finished-then-died" and ends[1].after_last_step and ends[1].status == -6
    assert first_failure(ends) is None  # rank 0 was stopped by torchrun after rank 1's abort, its work done
    outcome = decide(1, None, ends, 3.0, None)
    assert (outcome.stopped, outcome.exit_code, outcome.signal) == ("completed", 0, "SIGABRT")
    assert "interpreter shutdown" in outcome.notes[0]


def test_sigterm_in_shutdown_is_not_an_abort():
    end = rank_end(0, _rank_events(0, {"kind": "exit", "reason": "completed", "code": 0, "t": 1.0},
                                   {"kind": "process-exit", "code": -15, "signal": "SIGTERM", "time": 1001.2}))
    assert end.kind == "finished" and not end.after_last_step and end.signal == "SIGTERM"


def test_the_first_failure_by_time_is_the_cause():
    ends = {
        0: rank_end(0, _rank_events(0, {"kind": "exception", "type": "RuntimeError", "message": "Connection closed "
                                        "by peer", "t": 1.9}, {"kind": "exit", "reason": "exception", "code": 1,
                                                               "t": 1.95})),
        1: rank_end(1, _rank_events(1, {"kind": "exception", "type": "ValueError", "message": "bad\nsecond line",
                                        "t": 1.0}, {"kind": "exit", "reason": "exception", "code": 1, "t": 1.05})),
    }
    first = first_failure(ends)
    assert first.rank == 1 and first.error == "ValueError: bad"
    outcome = decide(1, None, ends, 3.0, None)
    assert (outcome.stopped, outcome.exit_code) == ("crashed", 1) and "Rank 1 failed first" in outcome.notes[0]


def _raised(rank: int, message: str) -> list[dict]:
    return _rank_events(rank, {"kind": "exception", "type": "RuntimeError", "message": message, "t": 1.9},
                        {"kind": "exit", "reason": "exception", "code": 1, "t": 1.95})


def test_on_one_node_of_several_a_lost_connection_points_to_the_other_node():
    """Node 0 of a 2-node job holds rank 0's evidence only: rank 0 lost its partner, it did not fail first."""
    lost = rank_end(0, _raised(0, "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4431"))
    assert lost.lost_peer and lost.world_size == 2 and remote_ranks({0: lost}) == [1]
    outcome = decide(1, None, {0: lost}, 3.0, None)
    assert outcome.stopped == "crashed"
    assert outcome.notes[0].startswith("Rank 0 lost its connection to another rank after 3 optimizer steps")
    assert "rank 1 runs on another node, where the failure began" in outcome.notes[0]
    nccl = rank_end(0, _raised(0, "ncclRemoteError: A call failed possibly due to a network error or a remote "
                                  "process exiting prematurely."))
    assert nccl.lost_peer
    # a failure of its own on one node is still the first failure; so is a lost connection with every rank here
    own = rank_end(0, _raised(0, "CUDA error: an illegal memory access was encountered"))
    assert not own.lost_peer and "Rank 0 failed first" in decide(1, None, {0: own}, 3.0, None).notes[0]
    both = {0: lost, 1: rank_end(1, _raised(1, "Connection reset by peer"))}
    assert remote_ranks(both) == [] and "Rank 0 failed first" in decide(1, None, both, 3.0, None).notes[0]


def test_a_segfault_without_an_exit_event_and_a_non_zero_exit():
    crash = rank_end(0, _rank_events(0, {"kind": "process-exit", "code": -11, "signal": "SIGSEGV", "time": 1001.0}))
    assert crash.kind == "crash" and crash.failed
    assert decide(1, None, {0: crash}, 2.0, None).stopped == "crashed"
    leaves = rank_end(1, _rank_events(1, {"kind": "exit", "reason": "exit", "code": 3, "t": 1.0}))
    outcome = decide(1, None, {1: leaves}, 2.0, None)
    assert (outcome.stopped, outcome.exit_code) == ("exited", 3)


# -- where a rank waits ---------------------------------------------------------------------------


def test_blocked_in_a_collective_names_the_outermost_c10d_call(tmp_path):
    user = (str(tmp_path / "train.py"), 12, "<module>")
    frames = [(C10D, 3000, "all_gather"), (LOGGER, 80, "wrapper"), (C10D, 3100, "all_gather_object"),
              (LOGGER, 80, "wrapper"), user]
    assert blocked_in(frames, str(tmp_path), False) == ("all_gather_object", None, user)
    assert blocked_in([(C10D, 5349, "barrier"), (LOGGER, 83, "wrapper"), user], str(tmp_path), False)[0] == "barrier"


def test_blocked_in_backward_is_ddps_all_reduce_only_with_ddp(tmp_path):
    user = (str(tmp_path / "train.py"), 20, "<module>")
    frames = [(f"{SITE}/torch/autograd/graph.py", 979, "_engine_run_backward"),
              (f"{SITE}/torch/autograd/__init__.py", 395, "backward"), (f"{SITE}/torch/_tensor.py", 623, "backward"),
              user]
    assert blocked_in(frames, str(tmp_path), True)[0] == "DDP gradient all-reduce (in backward)"
    assert blocked_in(frames, str(tmp_path), False)[:2] == (None, "backward")


def test_stuck_outside_any_collective(tmp_path):
    user = (str(tmp_path / "train.py"), 17, "<module>")
    assert blocked_in([user], str(tmp_path), True, "time.sleep(3600)") == (None, "time.sleep(3600)", user)
    loader = [(f"{SITE}/torch/utils/data/dataloader.py", 1300, "_try_get_data"),
              (f"{SITE}/torch/utils/data/dataloader.py", 700, "__next__"), user]
    assert blocked_in(loader, str(tmp_path), True)[1] == "__next__ (dataloader.py)"
    assert blocked_in([user], str(tmp_path), False, "work.wait()")[0] == "Work.wait (an async collective)"


# -- classification from recorded evidence -------------------------------------------------------


def _evidence(tmp_path: Path, events: dict[int, list[dict]], stopped: str = "crashed") -> RunEvidence:
    return RunEvidence(run_dir=tmp_path, cwd=str(tmp_path), target="train.py", project=str(tmp_path),
                       probes=["distributed"], events=events, outcome=Outcome(stopped, 1, None, 3.0),
                       thresholds={})


DETAIL = {  # TORCH_DISTRIBUTED_DEBUG=DETAIL's messages, as torch 2.13 wrote them in our --ddp-debug run
    0: "Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint("
       "SequenceNumber=4, OpType=ALLREDUCE, TensorShape=[3], TensorDtypes=Float), but Rank 1 is running "
       "collective: CollectiveFingerPrint(SequenceNumber=4OpType=REDUCE).",
    1: "Detected mismatch between collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint("
       "SequenceNumber=4OpType=BARRIER), but Rank 0 is running collective: CollectiveFingerPrint("
       "SequenceNumber=4OpType=GATHER).",
}


def test_detail_mismatch_errors_become_collective_mismatch(tmp_path):
    events = {
        rank: _rank_events(rank, {"kind": "exception", "type": "RuntimeError", "message": DETAIL[rank], "t": 1.0 + rank,
                                  "user_frame": {"path": str(tmp_path / "train.py"), "line": 30 + rank}},
                           {"kind": "exit", "reason": "exception", "code": 1, "t": 1.1 + rank})
        for rank in (0, 1)
    }
    found = distributed.analyse(_evidence(tmp_path, events))
    mismatch = {s.rank: s for s in found.symptoms if s.id == "collective-mismatch"}
    assert set(mismatch) == {0, 1}
    assert mismatch[0].evidence[0].values["op_type"] == "ALLREDUCE"
    assert mismatch[0].evidence[0].values["other_op_type"] == "BARRIER"  # rank 1's own view, not rank 0's guess
    assert mismatch[1].evidence[0].values["seq_num"] == 4
    assert not [s for s in found.symptoms if s.id == "rank-crashed"]
    assert "distributed" in found.contexts


def test_a_rank_that_ran_ahead_and_exited_while_the_other_waits(tmp_path):
    (tmp_path / "train.py").write_text("import torch\n" * 40)
    stacks = (f'Current thread 0x{0xabc:016x} (most recent call first):\n'
              f'  File "{C10D}", line 3245 in all_reduce\n'
              f'  File "{LOGGER}", line 83 in wrapper\n'
              f'  File "{tmp_path / "train.py"}", line 33 in <module>\n')
    (tmp_path / "stacks.rank0.txt").write_text(stacks)
    events = {
        0: _rank_events(0, {"kind": "exit", "reason": "terminated", "code": 143, "t": 30.0}),
        1: _rank_events(1, {"kind": "exit", "reason": "completed", "code": 0, "t": 2.0},
                        {"kind": "process-exit", "code": 0, "signal": None, "time": 1002.1}),
    }
    events[0][0]["main_thread"] = 0xabc
    run = _evidence(tmp_path, events, stopped="hang")
    run.options = {"distributed": {"decided_at": 1020.0, "peer_failed": None}}
    run.outcome.seconds_without_step = 18.0
    found = distributed.analyse(run)
    [crashed] = [s for s in found.symptoms if s.id == "rank-crashed"]
    assert crashed.rank == 1 and crashed.evidence[0].values["waiting_ranks"] == [0]
    assert crashed.evidence[0].values["exit_code"] == 0
    assert "rank 0 waits in all_reduce at train.py:33" in crashed.evidence[1].summary



# -- a node whose partners never join the rendezvous ------------------------------------------------


def _never_started(project: Path, *rendezvous: str):
    """The parent's whole diagnosis of a torchrun job in which no rank ever started (the supervisor's
    watchdog stopped the agent at the start-up allowance): nothing measured, no process needed."""
    from torchdoctor.run_process import ChildResult
    from torchdoctor.runner import build_report, evidence_of

    plan = make_plan(RunRequest(target=["train.py"], nproc_per_node="1", rendezvous=list(rendezvous),
                                probes=["distributed"], out=str(project / "run")), cwd=str(project))
    result = ChildResult(returncode=-15, decided="hang", duration_s=61.0, seconds_without_step=60.2,
                         sent_signal="SIGTERM")
    return build_report(plan, evidence_of(plan, result))


def test_a_node_left_alone_at_the_rendezvous_is_told_so(project):
    report = _never_started(project, "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "node0:29400")
    assert report.run.stopped == "hang"
    assert [s.id for s in report.symptoms] == ["distributed-init-failed"]  # not a script's `hang`
    [symptom] = report.symptoms
    assert symptom.evidence[0].summary == (
        "No rank started in 60.2 s: torchrun's agent on this node was still in the rendezvous at node0:29400, "
        "waiting for the job's other nodes to join (--nnodes 2, this node's rank 0)")
    assert symptom.evidence[0].values["host"] == "node0" and symptom.evidence[0].values["port"] == 29400
    assert report.reports[0].diagnosis.startswith("No rank started: this node's torchrun agent waited 60.2 s at "
                                                  "the rendezvous node0:29400 for the job's other nodes")
    assert [f.title for f in report.reports[0].fixes] == ["Multi-node: one reachable endpoint, same command on every node"]


def test_static_rendezvous_options_name_the_endpoint_too(project):
    report = _never_started(project, "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                            "--master-port", "29501")
    [symptom] = report.symptoms
    assert "rendezvous at 10.0.0.1:29501" in symptom.evidence[0].summary
    assert "this node's rank 1" in symptom.evidence[0].summary

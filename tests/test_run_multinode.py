"""Multi-node runs for real: two `torchdoctor run --nnodes 2 --node-rank {0,1}` processes on this machine.

Each scenario starts both nodes together, one rank each (gloo), with a static rendezvous on a free local
port (`--rdzv-endpoint 127.0.0.1:PORT`: node 0's torchrun agent hosts the store) and a run directory per
node, as two machines would have. Each scenario runs once per test session (a file lock shares it across
xdist workers, like tests/test_run_distributed.py); every one checks both exit codes, both reports against
the schema, that no process of either node's job is left (psutil: any process whose TORCHDOCTOR_RUN names
one of the run directories) and that the fixture did not change.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from tests.test_run_support import RUN_FIXTURES, line_of, processes_of, shared_root
from torchdoctor import exitcodes
from torchdoctor.analysis.evidence import read_events
from torchdoctor.analysis.ranks import wall_time

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.heavy]

SCRIPT = "ddp_multinode.py"


@dataclass
class Node:
    returncode: int
    stdout: str
    stderr: str
    report: dict
    run_dir: str
    wall_s: float
    ended_at: float  # wall-clock time the torchdoctor process ended

    @property
    def run(self) -> dict:
        return self.report["run"]

    def symptoms(self, symptom_id: str) -> list[dict]:
        return [s for s in self.report["symptoms"] if s["id"] == symptom_id]

    def events(self, rank: int) -> list[dict]:
        text = (Path(self.run_dir) / f"events.rank{rank}.jsonl").read_text()
        return [json.loads(line) for line in text.splitlines()]


@dataclass
class Job:
    nodes: list[Node]
    leftover: list[str] = field(default_factory=list)
    changed: bool = False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nodes(root: Path, name: str, mode: str, hang_timeouts: tuple[str, str] | None = None) -> Job:
    """Both nodes of a 2 x 1 job, started together; their results once both have ended."""
    port = free_port()
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
    env.pop("FORCE_COLOR", None)
    before = hashlib.sha256((RUN_FIXTURES / SCRIPT).read_bytes()).hexdigest()
    procs, dirs, started = [], [], time.monotonic()
    for node in (0, 1):
        run_dir = root / f"multinode-{name}-node{node}"
        dirs.append(run_dir)
        hang = ["--hang-timeout", hang_timeouts[node]] if hang_timeouts else []
        argv = [sys.executable, "-m", "torchdoctor.cli", "run", "--out", str(run_dir), "--format", "json",
                "-p", "distributed", *hang, "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(node),
                "--rdzv-endpoint", f"127.0.0.1:{port}", SCRIPT, "--", mode]
        procs.append(subprocess.Popen(argv, cwd=RUN_FIXTURES, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    nodes = []
    for proc, run_dir in zip(procs, dirs, strict=True):
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        ended = time.time()
        report_file = run_dir / "report.json"
        nodes.append(Node(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                          json.loads(report_file.read_text()) if report_file.exists() else {}, str(run_dir),
                          round(time.monotonic() - started, 2), ended))
    leftover = [p for d in dirs for p in processes_of(d)]
    changed = before != hashlib.sha256((RUN_FIXTURES / SCRIPT).read_bytes()).hexdigest()
    return Job(nodes, leftover, changed)


def job_once(tmp_path_factory, name: str, mode: str, hang_timeouts: tuple[str, str] | None = None) -> Job:
    root = shared_root(tmp_path_factory)
    saved = root / f"multinode-{name}.result.json"
    with open(root / f"multinode-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if saved.exists():
            data = json.loads(saved.read_text())
            return Job([Node(**n) for n in data["nodes"]], data["leftover"], data["changed"])
        job = start_nodes(root, name, mode, hang_timeouts)
        saved.write_text(json.dumps(asdict(job)))
        return job


def assert_sound(job: Job, validate_report, code: int) -> None:
    for node in job.nodes:
        assert node.returncode == code, node.stderr[-3000:]
        assert node.report, f"no report.json in {node.run_dir}: {node.stderr[-2000:]}"
        validate_report(node.report)
    assert job.leftover == [], f"processes left behind: {job.leftover}"
    assert not job.changed
    node0, node1 = job.nodes
    assert json.loads(node0.stdout) == node0.report  # rank 0's node prints the report
    assert node1.stdout == ""  # the other node writes its report.json and says where, on stderr
    assert f"rank 1 on this node: report in {node1.run_dir}/report.json" in node1.stderr
    for rank, node in enumerate(job.nodes):  # each node keeps its own rank's evidence
        assert sorted(p.name for p in Path(node.run_dir).glob("events.rank*.jsonl")) == [f"events.rank{rank}.jsonl"]


def values(symptom: dict) -> dict:
    merged: dict = {}
    for ev in symptom["evidence"]:
        for k, v in ev["values"].items():
            merged.setdefault(k, v)
    return merged


def last_step_time(node: Node, rank: int) -> float:
    events = read_events(Path(node.run_dir))[rank]  # with the steps file's records
    start = next(e for e in events if e["kind"] == "start")
    return wall_time(start, [e for e in events if e["kind"] == "step"][-1])


# -- a healthy job ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return job_once(tmp_path_factory, "healthy", "healthy")


def test_healthy_two_node_job_counts_each_nodes_steps(healthy, validate_report):
    assert_sound(healthy, validate_report, exitcodes.OK)
    for rank, node in enumerate(healthy.nodes):
        run = node.run
        assert run["stopped"] == "completed" and run["exit_code"] == 0
        assert run["ranks"] == 2 and run["steps_completed"] == 6
        assert run["command"][:7] == ["torchrun", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(rank)]
        numbers = run["measurements"]["distributed"]
        assert numbers["world_size"] == 2 and [r["rank"] for r in numbers["ranks"]] == [rank]
        assert "evidence of 1 here (the other nodes keep their own)" in numbers["summary"]
        assert f"rank {rank} finished 6 steps" in node.stderr  # --format json: the script's stdout on stderr
        for symptom in node.report["symptoms"]:  # the torch 2.13 CPU build may abort at exit: an info then
            assert symptom["id"] == "rank-crashed" and symptom["severity"] == "info", symptom


# -- a hang: rank 1 (node 1) never reaches the all_reduce rank 0 (node 0) waits in ------------------


@pytest.fixture(scope="module")
def hang(tmp_path_factory):
    return job_once(tmp_path_factory, "hang", "hang", ("3", "3"))


def test_a_hang_names_each_nodes_stuck_line(hang, validate_report):
    assert_sound(hang, validate_report, exitcodes.SCRIPT_FAILED)
    node0, node1 = hang.nodes
    for node in hang.nodes:
        assert node.run["stopped"] == "hang" and node.run["steps_completed"] == 3
    [waiting] = node0.symptoms("ddp-hang")
    assert waiting["rank"] == 0 and waiting["location"]["line"] == line_of(SCRIPT, "dist.all_reduce(total)")
    assert values(waiting)["collective"] == "all_reduce" and values(waiting)["remote_ranks"] == [1]
    summary = waiting["evidence"][0]["summary"]
    assert summary.startswith("No rank on this node made an optimizer step")
    assert "rank 1 runs on another node" in summary and "like every other rank" not in summary
    [stuck] = node1.symptoms("ddp-hang")
    assert stuck["rank"] == 1 and stuck["location"]["line"] == line_of(SCRIPT, "time.sleep(0.1)")
    assert values(stuck)["stuck_in"] == "time.sleep(0.1)" and values(stuck)["remote_ranks"] == [0]
    assert (Path(node0.run_dir) / "stacks.rank0.txt").exists() and (Path(node1.run_dir) / "stacks.rank1.txt").exists()


def test_both_nodes_end_within_the_hang_timeout(hang):
    for rank, node in enumerate(hang.nodes):
        waited = node.ended_at - last_step_time(node, rank)
        # 3 s without a step, 3 s for the other node's stacks ([distributed] node_settle_s), a second to stop
        assert 3.0 <= waited <= 3.0 + 3.0 + 8.0, waited


@pytest.fixture(scope="module")
def hang_skewed(tmp_path_factory):
    """Node 1's watchdog fires 1.5 s before node 0's (polling, a slow stack dump, load)."""
    return job_once(tmp_path_factory, "hang-skewed", "hang", ("4.5", "3"))


def test_the_first_node_to_stop_does_not_turn_the_others_hang_into_a_crash(hang_skewed, validate_report):
    """Node 1 stops its rank first; node 0's rank would then raise "Connection closed by peer" before its own
    watchdog took its stack, unless every node waits a moment after its stacks (node_settle_s)."""
    assert_sound(hang_skewed, validate_report, exitcodes.SCRIPT_FAILED)
    node0, node1 = hang_skewed.nodes
    assert node0.run["stopped"] == "hang", node0.report["symptoms"]
    [waiting] = node0.symptoms("ddp-hang")
    assert waiting["location"]["line"] == line_of(SCRIPT, "dist.all_reduce(total)")
    assert node1.run["stopped"] == "hang"


# -- a crash: rank 1 (node 1) raises while rank 0 (node 0) waits in the all_reduce ----------------------


@pytest.fixture(scope="module")
def crash(tmp_path_factory):
    return job_once(tmp_path_factory, "crash", "crash")


def test_a_crash_on_one_node_tears_the_other_down(crash, validate_report):
    assert_sound(crash, validate_report, exitcodes.SCRIPT_FAILED)  # and no process of either job is left
    for node in crash.nodes:
        assert node.run["stopped"] == "crashed" and node.wall_s < 30.0  # not gloo's 30 min, not torchrun's 30 s


def test_the_failing_node_names_the_error_and_the_other_points_to_it(crash):
    node0, node1 = crash.nodes
    [failed] = node1.symptoms("rank-crashed")
    assert failed["rank"] == 1 and failed["severity"] == "error"
    assert failed["location"]["line"] == line_of(SCRIPT, "raise RuntimeError")
    assert values(failed)["error"] == "RuntimeError: rank 1 lost its shard at step 3"
    assert values(failed)["first_failure"] is True
    # node 0 saw only its partner go away: not "rank 0 failed first"
    [lost] = node0.symptoms("rank-crashed")
    v = values(lost)
    assert lost["rank"] == 0 and v["lost_peer"] is True and v["first_failure"] is False and v["remote_ranks"] == [1]
    assert lost["location"]["line"] == line_of(SCRIPT, "dist.all_reduce(total)")
    assert lost["evidence"][0]["summary"].startswith("Rank 0 lost its connection to another rank after 3 ")
    assert not any("Rank 0 failed first" in note for note in node0.report["notes"])
    assert "rank 1 runs on another node" in node0.report["reports"][0]["diagnosis"]

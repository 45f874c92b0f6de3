"""Helpers for the `torchdoctor run` tests: one real run per scenario, shared across xdist workers.

`shared_run` runs `torchdoctor run … --out DIR --format json` once per
scenario name (a file lock makes the second xdist worker reuse the first's
result) and records, right after the run: the exit code, stdout, stderr,
report.json, whether the fixture scripts changed (hash before/after) and
which processes of the run are still alive (psutil: any process whose
TORCHDOCTOR_RUN names the run directory).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from tests.conftest import FIXTURES, cli

RUN_FIXTURES = FIXTURES / "run"


# The scripts these tests run. Other probes' fixtures share the folder and may be edited by a
# colleague while the tests run; they are hashed too, but only as "nothing new that is not source".
OWN = {
    "_tiny.py", "anomaly.py", "cuda_oom.py", "exits.py", "fidelity.py", "growing_list.py", "hangs.py",
    "healthy.py", "host_oom.py", "leak_total_loss.py", "marker_steps.py", "raises.py", "segfault.py",
    "selfkill.py", "slow_forever.py", "mypkg/__init__.py", "mypkg/train.py",
}


def tree_hash(root: Path) -> dict[str, str]:
    """Every file under `root` (bytecode caches aside) -> the hash of its bytes."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if "__pycache__" not in path.parts and path.is_file()
    }


def changed_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Our scripts that changed or went missing, and any new file that is not Python source
    (what a run could leave behind: a .torchdoctor directory, evidence, a snapshot)."""
    changed = [k for k in OWN if before.get(k) != after.get(k)]
    added = [k for k in after.keys() - before.keys() if not k.endswith(".py")]
    return sorted(changed + added)


def processes_of(run_dir: Path) -> list[str]:
    """Live (non-zombie) processes started for this run directory: '<pid> <cmdline>'."""
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            named = _run_dir_of(proc.environ().get("TORCHDOCTOR_RUN", ""))
            if named is not None and Path(named).resolve() == Path(run_dir).resolve():
                alive.append(f"{proc.pid} {' '.join(proc.cmdline())}")
        except (psutil.Error, OSError):
            continue
    return alive


def _run_dir_of(config: str) -> str | None:
    """The run directory a process's TORCHDOCTOR_RUN names. Compared whole: a substring test took
    `run-long-validation-block`'s blocked child, still being stopped by its own test on the other
    xdist worker, for a process left behind by `run-long-validation`."""
    try:
        value = json.loads(config)
    except ValueError:
        return None
    return value.get("run_dir") if isinstance(value, dict) else None


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    report: dict
    run_dir: str
    changed: list[str]  # fixture files that changed during the run
    leftover: list[str] = field(default_factory=list)

    def symptoms(self, symptom_id: str) -> list[dict]:
        return [s for s in self.report["symptoms"] if s["id"] == symptom_id]

    def values(self, symptom_id: str) -> dict:
        """Every evidence value of a symptom, merged (first occurrence wins)."""
        merged: dict = {}
        for s in self.symptoms(symptom_id):
            for ev in s["evidence"]:
                for k, v in ev["values"].items():
                    merged.setdefault(k, v)
        return merged

    @property
    def run(self) -> dict:
        return self.report["run"]


def line_of(fixture: str, text: str) -> int:
    """The number of the first line of a run fixture that contains `text` (tests name lines, not numbers)."""
    lines = (RUN_FIXTURES / fixture).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def shared_root(tmp_path_factory) -> Path:
    """A temporary directory every xdist worker of this session shares."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def run_once(run_dir: Path, *args: str, env: dict | None = None, cwd: Path = RUN_FIXTURES,
             timeout: float = 120) -> RunResult:
    before = tree_hash(RUN_FIXTURES)
    proc = cli("run", "--out", str(run_dir), "--format", "json", *args, env=env, cwd=cwd, timeout=timeout)
    leftover = processes_of(run_dir)
    report_file = run_dir / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return RunResult(
        returncode=proc.returncode,
        stdout=proc.stdout_text,
        stderr=proc.stderr_text,
        report=report,
        run_dir=str(run_dir),
        changed=changed_files(before, tree_hash(RUN_FIXTURES)),
        leftover=leftover,
    )


def shared_run(tmp_path_factory, name: str, *args: str, env: dict | None = None, cwd: Path = RUN_FIXTURES,
               timeout: float = 120) -> RunResult:
    """Run a scenario once per test session, whichever xdist worker asks first."""
    root = shared_root(tmp_path_factory)
    run_dir = root / f"run-{name}"
    saved = root / f"run-{name}.result.json"
    with open(root / f"run-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if saved.exists():
            return RunResult(**json.loads(saved.read_text()))
        result = run_once(run_dir, *args, env=env, cwd=cwd, timeout=timeout)
        saved.write_text(json.dumps(asdict(result)))
        return result


def assert_sound(result: RunResult, validate_report, exit_code: int) -> None:
    """What every run must satisfy: the exit code, a valid report, nothing left behind, no file changed."""
    assert result.returncode == exit_code, result.stderr[-3000:]
    assert result.report, f"no report.json in {result.run_dir}: {result.stderr[-2000:]}"
    validate_report(result.report)
    assert json.loads(result.stdout) == result.report  # --format json prints the same object, alone
    assert result.leftover == [], f"processes left behind: {result.leftover}"
    assert result.changed == [], f"fixture files changed during the run: {result.changed}"


# Info-level symptoms whose presence on a CPU run depends on how loaded the machine is (issue 13: never above
# info there). A healthy script's "no symptoms" assertion reads the rest.
LOAD_DEPENDENT = frozenset({"launch-bound", "slow-step"})


def diagnosed(result: RunResult) -> list[dict]:
    """The report's symptoms, less the load-dependent information a busy test machine may add."""
    return [s for s in result.report["symptoms"] if not (s["id"] in LOAD_DEPENDENT and s["severity"] == "info")]


def test_the_hashed_fixture_scripts_exist():
    assert all((RUN_FIXTURES / name).is_file() for name in OWN)


def test_leftover_processes_are_matched_by_their_whole_run_directory(tmp_path):
    """A live process of this run is found; one of a run whose directory only starts with the same name is not."""
    import subprocess
    import sys

    ours, other = tmp_path / "run-a", tmp_path / "run-a-block"
    sleepers = []
    for run_dir in (ours, other):
        env = dict(os.environ, TORCHDOCTOR_RUN=json.dumps({"v": 1, "run_dir": str(run_dir)}))
        sleepers.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env))
    try:
        found = processes_of(ours)
        assert [line.split()[0] for line in found] == [str(sleepers[0].pid)]
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()

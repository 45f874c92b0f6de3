"""`torchdoctor run` from the command line: usage errors, fidelity to plain Python, --steps, formats, env."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import cli
from tests.test_run_support import (
    RUN_FIXTURES,
    assert_sound,
    changed_files,
    processes_of,
    shared_root,
    shared_run,
    tree_hash,
)
from torchdoctor import exitcodes
from torchdoctor.run_files import MANIFEST

# -- usage errors: one line, exit 2, nothing created ------------------------------------------


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["missing.py"], "no such script: missing.py"),
        ([], "missing the script to run"),
        (["fidelity.py", "--probe", "nosuch"], "unknown probe 'nosuch'"),
        (["fidelity.py", "--gpu-memory", "ten"], "--gpu-memory 'ten' is not a size"),
        (["fidelity.py", "--format", "sarif"], "unknown format 'sarif'"),
        (["fidelity.py", "--fail-on", "info"], "--fail-on 'info'"),
        (["fidelity.py", "--steps", "0"], "--steps must be at least 1"),
        (["fidelity.py", "--hang-timeout", "-1"], "--hang-timeout must be 0"),
        (["-m", "no_such_pkg.train"], "no module named 'no_such_pkg.train'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(tmp_path, args, fragment):
    shutil.copy(RUN_FIXTURES / "fidelity.py", tmp_path / "fidelity.py")
    before = sorted(os.listdir(tmp_path))
    proc = cli("run", *args, cwd=tmp_path)
    assert proc.returncode == exitcodes.USAGE
    assert proc.stderr_text.count("\n") == 1 and proc.stderr_text.startswith("torchdoctor: ")
    assert fragment in proc.stderr_text
    assert "Traceback" not in proc.stderr_text and proc.stdout_text == ""
    assert sorted(os.listdir(tmp_path)) == before  # no .torchdoctor, nothing touched


@pytest.mark.parametrize(
    "args,corrected",
    [
        (["fidelity.py", "--lr", "3e-4"], "torchdoctor run fidelity.py -- --lr 3e-4"),
        (["fidelity.py", "--steps", "5", "--lr=3e-4", "-x", "two words"],
         "torchdoctor run --steps 5 fidelity.py -- --lr=3e-4 -x 'two words'"),
        (["fidelity.py", "--lr", "1", "--", "--epochs", "2"], "torchdoctor run fidelity.py -- --lr 1 --epochs 2"),
        (["-m", "pkg.train", "--lr", "1"], "torchdoctor run -m pkg.train -- --lr 1"),
        (["fidelity.py", "-pmemory", "-1"], "torchdoctor run -pmemory fidelity.py -- -1"),
    ],
)
def test_script_options_before_dashdash_show_the_corrected_line(tmp_path, args, corrected):
    shutil.copy(RUN_FIXTURES / "fidelity.py", tmp_path / "fidelity.py")
    proc = cli("run", *args, cwd=tmp_path)
    assert proc.returncode == exitcodes.USAGE and proc.stdout_text == ""
    option = next(a for a in args[1:] if a.startswith("-") and a.split("=")[0] not in ("--steps", "-m", "-pmemory"))
    assert proc.stderr_text == (f"torchdoctor: {option.split('=')[0] if '=' in option else option} is not an option "
                                f"of torchdoctor run; the script's own arguments go after `--`: {corrected}\n")
    assert sorted(os.listdir(tmp_path)) == ["fidelity.py"]


def test_the_corrected_line_runs_the_script_with_its_arguments(tmp_path):
    import shlex

    shutil.copy(RUN_FIXTURES / "fidelity.py", tmp_path / "fidelity.py")
    proc = cli("run", "fidelity.py", "--lr", "3e-4", "--probe", "none", cwd=tmp_path)
    corrected = proc.stderr_text.rsplit("`--`: ", 1)[1].strip()
    assert corrected == "torchdoctor run --probe none fidelity.py -- --lr 3e-4"
    env = {"FIDELITY_OUT": str(tmp_path / "seen.json")}
    proc = cli(*shlex.split(corrected)[1:2], "--out", "out", *shlex.split(corrected)[2:], cwd=tmp_path, env=env)
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    assert json.loads((tmp_path / "seen.json").read_text())["argv"] == ["fidelity.py", "--lr", "3e-4"]


def test_unknown_option_before_the_script_is_one_line(tmp_path):
    proc = cli("run", "--lr", "3", "fidelity.py", cwd=tmp_path)
    assert proc.returncode == exitcodes.USAGE
    assert proc.stderr_text == "torchdoctor: --lr is not an option of torchdoctor run (see `torchdoctor run --help`)\n"


TINY_TRAINING = """\
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained")
"""


def _runtime_dependencies() -> set[str]:
    import re

    import tomllib

    from tests.conftest import ROOT

    with open(ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    return {re.match(r"[A-Za-z0-9_.-]+", dep).group().lower() for dep in project["dependencies"]}


def test_a_run_prints_no_numpy_warning_with_only_the_runtime_dependencies(tmp_path):
    """torch warns "Failed to initialize NumPy" at import when numpy is missing, so every run of a plain
    `pip install torchdoctor` printed it. The test venv has numpy (dev extras), so numpy is hidden from
    the script unless it is a runtime dependency, as it would be missing from a user's install."""
    (tmp_path / "train.py").write_text(TINY_TRAINING)
    env = {}
    if "numpy" not in _runtime_dependencies():
        stub = tmp_path / "not-installed" / "numpy"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
        env["PYTHONPATH"] = str(stub.parent)
    proc = cli("run", "train.py", "--probe", "none", "--out", "run", cwd=tmp_path, env=env)
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    assert "trained" in proc.stdout_text and "The script completed: 3 optimizer steps" in proc.stdout_text
    output = proc.stdout_text + proc.stderr_text
    assert "NumPy" not in output and "UserWarning" not in output, output


def test_out_must_be_a_directory(tmp_path):
    (tmp_path / "taken").write_text("mine")
    proc = cli("run", str(RUN_FIXTURES / "fidelity.py"), "--out", str(tmp_path / "taken"))
    assert proc.returncode == exitcodes.USAGE and "is not a directory" in proc.stderr_text
    assert (tmp_path / "taken").read_text() == "mine"


# Names a run writes (torchdoctor.run_files.OUR_FILES): the user's own file of such a name is never replaced.
LOOKALIKES = ["report.json", "lr_curves.csv", "stacks.rank0.txt", "trace.rank0.json", "events.rank0.jsonl",
              "crash.rank0.txt", "steps.rank3.jsonl", "memory_snapshot.rank1.pickle", "report.json.4242.tmp",
              "report.html", "report.html.4242.tmp"]


@pytest.mark.parametrize("name", LOOKALIKES)
def test_out_never_replaces_a_users_file_named_like_ours(tmp_path, name):
    (tmp_path / name).write_text("the user's own data")
    (tmp_path / "notes.txt").write_text("mine too")
    before = sorted(os.listdir(tmp_path))
    proc = cli("run", str(RUN_FIXTURES / "fidelity.py"), "--out", str(tmp_path))
    assert proc.returncode == exitcodes.USAGE, proc.stderr_text[-2000:]
    lines = proc.stderr_text.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "move it away or choose another --out" in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == before  # refused before anything was written
    assert (tmp_path / name).read_text() == "the user's own data"


def test_out_refuses_a_file_of_ours_that_the_user_changed_since(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    out = tmp_path / "out"
    runs = [cli("run", str(script), "--out", str(out), "--probe", "none", "--format", "json") for _ in range(2)]
    assert [r.returncode for r in runs] == [exitcodes.OK] * 2, runs[-1].stderr_text[-2000:]  # its own: replaced
    assert MANIFEST in os.listdir(out)
    report = out / "report.json"
    report.write_text(report.read_text() + "\n")  # the user annotated it
    second = cli("run", str(script), "--out", str(out), "--probe", "none")
    assert second.returncode == exitcodes.USAGE and "report.json has changed since" in second.stderr_text
    assert report.read_text().endswith("\n\n")


def test_a_symlink_named_like_ours_is_refused_and_its_target_kept(tmp_path):
    target = tmp_path / "precious.csv"
    target.write_text("data")
    out = tmp_path / "out"
    out.mkdir()
    (out / "lr_curves.csv").symlink_to(target)
    proc = cli("run", str(RUN_FIXTURES / "fidelity.py"), "--out", str(out))
    assert proc.returncode == exitcodes.USAGE and "lr_curves.csv" in proc.stderr_text
    assert (out / "lr_curves.csv").is_symlink() and target.read_text() == "data"


def test_the_parent_never_imports_torch():
    code = (
        "import sys, torchdoctor.cli, torchdoctor.cli_run, torchdoctor.runner, torchdoctor.run_process, "
        "torchdoctor.analysis.memory, torchdoctor.analysis.env, torchdoctor.analysis.faults, "
        "torchdoctor.render.run_summary, torchdoctor.probes, torchdoctor.probes.session; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the script runs as under plain Python ----------------------------------------------------


def _plain(args: list[str], out: str, cwd) -> dict:
    env = {**os.environ, "FIDELITY_OUT": out}
    subprocess.run([sys.executable, *args], cwd=cwd, env=env, check=True, capture_output=True)
    with open(out) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory):
    out = shared_root(tmp_path_factory)  # the run may be made by another xdist worker
    env = {"FIDELITY_OUT": str(out / "fidelity-probed.json")}
    # run from the fixtures' parent with a relative path, as a user would type it
    result = shared_run(tmp_path_factory, "fidelity", "run/fidelity.py", "--", "--lr", "3e-4", "a b",
                        env=env, cwd=RUN_FIXTURES.parent)
    probed = json.loads((out / "fidelity-probed.json").read_text())
    plain = _plain(["run/fidelity.py", "--lr", "3e-4", "a b"], str(out / "fidelity-plain.json"), RUN_FIXTURES.parent)
    return result, probed, plain


def test_script_sees_what_plain_python_shows(fidelity, validate_report):
    result, probed, plain = fidelity
    assert_sound(result, validate_report, exitcodes.OK)
    assert probed["argv"] == ["run/fidelity.py", "--lr", "3e-4", "a b"]
    for key in ("argv", "cwd", "path0", "name", "file", "main_file", "spec"):
        assert probed[key] == plain[key], key
    assert probed["torch_preloaded"] is False  # the bootstrap waits for the script's own import


def test_json_keeps_the_scripts_stdout_off_stdout(fidelity):
    result, _, _ = fidelity
    json.loads(result.stdout)  # stdout is the report alone
    assert "fidelity stdout line" in result.stderr
    assert [s["id"] for s in result.report["symptoms"]] == ["nothing-measured"]  # fidelity.py trains nothing


def test_module_runs_like_python_dash_m(tmp_path_factory, validate_report):
    out = shared_root(tmp_path_factory)
    result = shared_run(tmp_path_factory, "module", "-m", "mypkg.train", "--", "x", "y",
                        env={"FIDELITY_OUT": str(out / "module-probed.json")})
    assert_sound(result, validate_report, exitcodes.OK)
    probed = json.loads((out / "module-probed.json").read_text())
    plain = _plain(["-m", "mypkg.train", "x", "y"], str(out / "module-plain.json"), RUN_FIXTURES)
    assert probed == plain
    assert result.report["target"] == "-m mypkg.train"
    assert result.run["command"] == ["python", "-m", "mypkg.train", "x", "y"]
    assert result.run["steps_completed"] == 2


def test_default_run_directory(tmp_path):
    shutil.copy(RUN_FIXTURES / "fidelity.py", tmp_path / "fidelity.py")
    proc = cli("run", "fidelity.py", "--probe", "none", cwd=tmp_path, env={"FIDELITY_OUT": str(tmp_path / "f.json")})
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    runs = list((tmp_path / ".torchdoctor" / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "report.json").exists()
    assert (tmp_path / ".torchdoctor" / ".gitignore").read_text().strip().endswith("*")
    assert "The script completed" in proc.stdout_text
    # fidelity.py trains nothing (no optimizer step, torch never imported): a warning, under the default --fail-on
    assert "nothing-measured" in proc.stdout_text and "No symptoms found." not in proc.stdout_text


def test_markdown_format(tmp_path):
    proc = cli("run", "fidelity.py", "--out", str(tmp_path), "-f", "markdown", "--probe", "none",
               cwd=RUN_FIXTURES, env={"FIDELITY_OUT": str(tmp_path / "f.json")})
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    # markdown and text leave the script's own stdout where it was; the report follows it
    script_line, _, report = proc.stdout_text.partition("\n")
    assert script_line == "fidelity stdout line"
    assert report.startswith("# torchdoctor run fidelity.py")
    assert "## Run" in report and "The script completed" in report


# -- --steps -------------------------------------------------------------------------------------


def test_steps_stops_the_script_on_purpose(tmp_path, validate_report):
    before = tree_hash(RUN_FIXTURES)
    marker = tmp_path / "marker.txt"
    proc = cli("run", "marker_steps.py", "--steps", "3", "--out", str(tmp_path / "run"), "-f", "json",
               "--", str(marker), cwd=RUN_FIXTURES)
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    report = validate_report(proc.stdout_text)
    assert report["run"]["stopped"] == "steps" and report["run"]["exit_code"] == 0
    assert report["run"]["steps_completed"] == 3
    # step 3 was stopped inside optimizer.step(): the script never wrote "3" nor went on
    assert marker.read_text().split() == ["1", "2"]
    assert "Traceback" not in proc.stderr_text
    assert processes_of(tmp_path / "run") == [] and changed_files(before, tree_hash(RUN_FIXTURES)) == []


# -- env probe -----------------------------------------------------------------------------------


def test_env_probe_fills_the_environment(tmp_path_factory):
    result = shared_run(tmp_path_factory, "healthy", "healthy.py", "--gpu-memory", "10GiB")
    env = result.report["environment"]
    import torch

    assert env["torch"] == torch.__version__ and env["device"] == "cpu"
    assert env["python"] == sys.version.split()[0]
    for key in ("float32_matmul_precision", "tf32_matmul", "cudnn_benchmark", "deterministic_algorithms",
                "num_threads", "variables"):
        assert key in env
    assert not result.symptoms("anomaly-detection-enabled")  # the healthy twin


COMPILED_TRAINING = """\
import torch

model = torch.compile(torch.nn.Linear(4, 1), backend="eager")  # torch sets TORCHINDUCTOR_CACHE_DIR itself
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_environment_is_what_the_user_gave_and_every_file_is_an_artifact(tmp_path, monkeypatch, validate_report):
    """`variables` are the ones the script started with, not the ones torch set while it ran (those are
    `variables_changed`); and every file the run wrote is listed among the artifacts (steps.rank0.jsonl was not)."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    (tmp_path / "train.py").write_text(COMPILED_TRAINING)
    proc = cli("run", "train.py", "--out", "run", "-f", "json", cwd=tmp_path,
               env={"NCCL_DEBUG": "WARN"})
    assert proc.returncode == exitcodes.OK, proc.stderr_text[-2000:]
    report = validate_report(proc.stdout_text)
    env = report["environment"]
    assert env["variables"]["NCCL_DEBUG"] == "WARN"
    assert "TORCHINDUCTOR_CACHE_DIR" not in env["variables"]
    assert env["variables_changed"]["TORCHINDUCTOR_CACHE_DIR"]  # torch set it during the run: said so, apart
    summary = report["run"]["measurements"]["env"]["summary"]
    assert "NCCL_DEBUG" in summary.split("set: ")[1].split(", ") and "TORCHINDUCTOR" not in summary
    listed = {os.path.normpath(p) for p in report["artifacts"].values()}
    # the manifest is written after the report (it records report.json): torchdoctor's bookkeeping, not evidence
    written = {os.path.join("run", name) for name in os.listdir(tmp_path / "run") if name != MANIFEST}
    assert report["artifacts"]["steps"] == "run/steps.rank0.jsonl"
    assert written <= listed, written - listed


def test_anomaly_detection_left_on(tmp_path_factory, validate_report):
    result = shared_run(tmp_path_factory, "anomaly", "anomaly.py", "--probe", "env",
                        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert_sound(result, validate_report, exitcodes.OK)  # a warning: below the default --fail-on error
    assert result.symptoms("anomaly-detection-enabled")[0]["severity"] == "warning"
    assert result.report["environment"]["variables"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert result.report["environment"]["anomaly_detection"] is True

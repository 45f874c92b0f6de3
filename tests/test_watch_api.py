"""`torchdoctor.watch()`: the probes of `run` inside the current process, around a block (issue 17).

Scripts in tests/fixtures/watch/ run in their own interpreter (as a user's would); the last tests run a
session inside this test process to prove that it leaves torch as it found it.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, cli

WATCH = FIXTURES / "watch"


def run_script(name: str, out: Path, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("TORCHDOCTOR_RUN", None)
    return subprocess.run([sys.executable, str(WATCH / name), str(out), *extra], capture_output=True, text=True,
                          env=env, cwd=str(out.parent), timeout=timeout)


def report_of(out: Path, validate_report) -> dict:
    return validate_report(json.loads((out / "report.json").read_text()))


def line_of(name: str, text: str) -> int:
    lines = (WATCH / name).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_import_is_cheap_and_the_api_is_listed():
    code = ("import sys, torchdoctor; names = dir(torchdoctor); "
            "print('torch' in sys.modules, 'watch' in names, 'LightningCallback' in names, "
            "'torchdoctor.watching' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "True", "False"]


def test_a_missing_name_is_an_attribute_error():
    import torchdoctor

    with pytest.raises(AttributeError, match="no attribute 'wach'"):
        torchdoctor.wach  # noqa: B018


@pytest.mark.slow
def test_a_healthy_loop_counts_its_steps_and_reports_nothing(tmp_path, validate_report):
    out = tmp_path / "run"
    proc = run_script("plain_loop.py", out)
    assert proc.returncode == 0, proc.stderr
    assert "counted 30" in proc.stdout
    report = report_of(out, validate_report)
    assert report["command"] == "run" and report["run"]["steps_completed"] == 30
    assert report["run"]["stopped"] == "completed"
    assert report["symptoms"] == [], report["symptoms"]
    assert report["target"] == f"torchdoctor.watch() at {WATCH / 'plain_loop.py'}:{line_of('plain_loop.py', 'with torchdoctor.watch(')}"
    assert report["run"]["measurements"]["nan"]["grad_checks"] >= 1  # the probes did run
    assert (out / "events.rank0.jsonl").is_file()


@pytest.mark.slow
def test_a_leak_in_the_block_is_found_at_its_line(tmp_path, validate_report):
    out = tmp_path / "run"
    proc = run_script("leak_loop.py", out)
    assert proc.returncode == 0, proc.stderr
    report = report_of(out, validate_report)
    growth = [s for s in report["symptoms"] if s["id"] == "memory-growth"]
    assert len(growth) == 1 and growth[0]["severity"] == "error", report["symptoms"]
    assert growth[0]["location"]["line"] == line_of("leak_loop.py", "losses.append(loss)")
    assert report["reports"] and report["reports"][0]["specialist"] == "memory"
    page = (out / "report.html").read_text(encoding="utf-8")  # a watch() block writes the run's page too
    assert "What holds the leak: `losses`" in page and "Loss per optimizer step" in page


@pytest.mark.slow
def test_steps_ends_the_block_and_the_code_after_it_runs(tmp_path, validate_report):
    out = tmp_path / "run"
    proc = run_script("steps_then_more.py", out)
    assert proc.returncode == 0, proc.stderr
    assert "after the block: 5 iterations, 5 steps" in proc.stdout
    report = report_of(out, validate_report)
    assert report["run"]["stopped"] == "steps" and report["run"]["steps_completed"] == 5


@pytest.mark.slow
def test_an_exception_is_diagnosed_then_raised_on_unchanged(tmp_path, validate_report):
    out = tmp_path / "run"
    proc = run_script("raises_in_block.py", out)
    assert proc.returncode == 0, proc.stderr
    assert "caught ValueError('bad batch 3')" in proc.stdout
    assert "stopped crashed" in proc.stdout
    report = report_of(out, validate_report)
    assert report["run"]["steps_completed"] == 4
    assert report["run"]["error"]["type"] == "ValueError"
    assert report["run"]["error"]["location"]["line"] == line_of("raises_in_block.py", "raise ValueError")


@pytest.mark.slow
def test_a_block_without_a_step_warns_that_it_measured_nothing(tmp_path, validate_report):
    out = tmp_path / "run"
    proc = run_script("no_steps.py", out)
    assert proc.returncode == 0, proc.stderr
    report = report_of(out, validate_report)
    assert [(s["id"], s["severity"]) for s in report["symptoms"]] == [("nothing-measured", "warning")]


@pytest.mark.slow
def test_show_prints_the_text_report_to_stderr(tmp_path):
    out = tmp_path / "run"
    proc = run_script("shown.py", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert "3 optimizer steps" in proc.stderr and "No symptoms found." in proc.stderr


@pytest.mark.slow
def test_under_torchdoctor_run_the_block_is_measured_by_the_run(tmp_path, validate_report):
    out, inner = tmp_path / "run", tmp_path / "inner"
    proc = cli("run", str(WATCH / "plain_loop.py"), "--out", str(out), "--format", "json", "--", str(inner),
               timeout=240)
    assert proc.returncode == 0, proc.stderr_text
    report = validate_report(proc.stdout_text)
    assert report["run"]["steps_completed"] == 30
    assert not inner.exists()  # the block's own session stood aside


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.heavy  # a 2-rank torchrun job, like the other torchrun tests
def test_every_rank_of_a_torchrun_job_gets_its_own_run_directory_and_only_rank_0_prints(tmp_path, validate_report):
    out = tmp_path / "run"
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("TORCHDOCTOR_RUN", None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           str(WATCH / "two_ranks.py"), str(out)], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 counted 12" in proc.stdout and "rank 1 counted 12" in proc.stdout
    for rank in (0, 1):
        report = validate_report(json.loads((out / f"rank{rank}" / "report.json").read_text()))
        assert report["run"]["steps_completed"] == 12, rank
        assert sorted(p.name for p in (out / f"rank{rank}").glob("events.rank*.jsonl")) == [f"events.rank{rank}.jsonl"]
    assert proc.stderr.count("No symptoms found.") == 1 and "run/rank0/report.json" in proc.stderr  # rank 0 prints

    # without out=: one folder for the job (torchrun's run id), one per rank inside it
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           str(WATCH / "two_ranks.py")], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr
    reports = sorted(str(p.relative_to(tmp_path / ".torchdoctor" / "runs"))
                     for p in (tmp_path / ".torchdoctor" / "runs").glob("watch-*/rank*/report.json"))
    assert len(reports) == 2 and reports[0].split("/")[0] == reports[1].split("/")[0], reports
    assert (tmp_path / ".torchdoctor" / ".gitignore").read_text().endswith("*\n")


# -- inside this process: the session leaves torch as it found it --------------------------------


def _global_hooks() -> dict[str, int]:
    from torch.nn.modules import module
    from torch.optim import optimizer

    return {f"{m.__name__}.{name}": len(value) for m in (module, optimizer) for name, value in vars(m).items()
            if name.startswith("_global_") and isinstance(value, dict)}


def _train(torch, model, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        sched.step()


@pytest.mark.slow
def test_the_process_is_as_before_after_the_block_and_a_second_block_counts_afresh(tmp_path):
    torch = pytest.importorskip("torch")
    import warnings

    import torchdoctor

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    before = {
        "save": torch.save, "load": torch.load, "backward": torch.autograd.backward, "compile": torch.compile,
        "warn": warnings.warn, "step_lr_init": torch.optim.lr_scheduler.StepLR.__init__,
        "loader_init": torch.utils.data.DataLoader.__init__, "getstate": torch.nn.Module.__getstate__,
    }
    assert _functions_of_ours_in_torch() == []
    hooks = _global_hooks()
    with torchdoctor.watch(out=tmp_path / "one", show=False) as first:
        assert torch.save is not before["save"]  # the probes are in place while the block runs
        assert len(_functions_of_ours_in_torch()) > 10
        _train(torch, model, 6)
    after = {
        "save": torch.save, "load": torch.load, "backward": torch.autograd.backward, "compile": torch.compile,
        "warn": warnings.warn, "step_lr_init": torch.optim.lr_scheduler.StepLR.__init__,
        "loader_init": torch.utils.data.DataLoader.__init__, "getstate": torch.nn.Module.__getstate__,
    }
    from torchdoctor.probes import transparent

    # An earlier in-process test of this worker may have left transparent.py's `warnings.warn` installed (seen only
    # in some xdist orders): the block then restores the original, which is what "nothing of ours" means.
    leaked = before["warn"] is transparent.warn
    expected = dict.fromkeys(before, True) | ({"warn": False} if leaked else {})
    assert {k: v is before[k] for k, v in after.items()} == expected, (leaked, after["warn"])
    assert after["warn"] is not transparent.warn
    assert _global_hooks() == hooks
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert first.report().run.steps_completed == 6

    with torchdoctor.watch(out=tmp_path / "two", show=False) as second:
        _train(torch, model, 4)
    assert second.report().run.steps_completed == 4
    assert second.report().run.measurements["nan"]["grad_checks"] >= 1
    assert _global_hooks() == hooks
    _train(torch, model, 2)  # plain training after both blocks: nothing of ours runs
    assert not list((tmp_path / "two").glob("*.tmp"))
    assert _functions_of_ours_in_torch() == []


def test_dynamo_first_imported_inside_the_block_gets_torchs_module_init_back(tmp_path):
    # Dynamo saves nn.Module.__init__ when it is first imported; inside the block that is our wrapper. A fresh
    # process, since this one may have imported dynamo already.
    script = tmp_path / "first_dynamo.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import torch
        import torchdoctor
        assert "torch._dynamo" not in sys.modules
        original = torch.nn.Module.__init__
        with torchdoctor.watch(out={str(tmp_path / "out")!r}, show=False):
            torch.nn.Linear(2, 2)
            import torch._dynamo.variables.misc
        assert torch.nn.Module.__init__ is original
        assert torch._dynamo.mutation_guard.unpatched_nn_module_init is original
        assert torch._dynamo.variables.misc.unpatched_nn_module_init is original
        print("restored")
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("restored"), proc.stderr[-2000:]


def _functions_of_ours_in_torch() -> list[str]:
    """Every function of a torchdoctor probe still reachable from torch's modules and their classes."""
    import inspect
    import types
    import warnings

    warnings.simplefilter("ignore", FutureWarning)  # torch.distributed's deprecated names, seen by the walk
    probes_dir = str(Path(__file__).resolve().parent.parent / "probes")
    found = []
    for name, module in list(sys.modules.items()):
        if not (name == "torch" or name.startswith("torch.")) or module is None:
            continue
        try:
            members = list(vars(module).items())
        except TypeError:
            continue
        spaces = [(name, members)] + [(f"{name}.{k}", list(vars(v).items())) for k, v in members
                                      if inspect.isclass(v) and getattr(v, "__module__", "") == name]
        for where, items in spaces:
            for attr, value in items:
                fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
                if isinstance(fn, types.FunctionType) and fn.__code__.co_filename.startswith(probes_dir):
                    found.append(f"{where}.{attr}")
    return found


def test_bad_arguments_are_clear_errors_before_anything_runs(tmp_path):
    import torchdoctor

    with pytest.raises(ValueError, match="steps must be a whole number of at least 1"):
        torchdoctor.watch(steps=0, out=tmp_path / "x").start()
    with pytest.raises(ValueError, match="unknown probe 'memroy'"):
        torchdoctor.watch(probes="memroy", out=tmp_path / "y").start()


@pytest.mark.slow
def test_one_session_at_a_time_and_reports_in_every_format(tmp_path):
    torch = pytest.importorskip("torch")
    import torchdoctor

    model = torch.nn.Linear(4, 1)
    with torchdoctor.watch(out=tmp_path / "run", show=False, probes="memory,nan") as session:
        with pytest.raises(RuntimeError, match="already running"):
            torchdoctor.watch(out=tmp_path / "other").start()
        _train(torch, model, 3)
    html = session._repr_html_()
    assert html.startswith('<div class="torchdoctor-report"') and "3 optimizer steps" in html
    # in a notebook cell the summary is followed by the run's per-step charts, drawn from its run directory
    summary, charts = html.split('<div class="torchdoctor-charts">')
    assert session.report()._repr_html_() == summary
    assert "Loss per optimizer step" in charts and charts.count("<svg") >= 2 and "<script" not in charts
    assert "body {" not in charts  # the notebook's own page keeps its styles
    assert json.loads(session.write(tmp_path / "r.json").read_text())["run"]["steps_completed"] == 3
    page = session.write(tmp_path / "r.html").read_text()  # the run's whole page, its file links from tmp_path
    assert page.startswith("<!DOCTYPE html>") and "Loss per optimizer step" in page
    assert '<a href="run/steps.rank0.jsonl">' in page and (tmp_path / "run" / "report.html").is_file()
    assert "3 optimizer steps" in session.write(tmp_path / "r.md").read_text()
    with pytest.raises(ValueError, match="write a .json, .html or .md file"):
        session.write(tmp_path / "r.txt")
    assert session.report().run.probes == ["memory", "nan"]
    summary, full = io.StringIO(), io.StringIO()
    session.render(stream=summary)
    session.render(stream=full, details=True)  # as `run --details`: every probe's numbers after the summary
    assert "3 optimizer steps" in summary.getvalue() and "Measured by each probe" not in summary.getvalue()
    # in Python the pointer names the argument, not the CLI's option
    assert "`session.render(details=True)` prints" in summary.getvalue() and "--details" not in summary.getvalue()
    assert full.getvalue().startswith(summary.getvalue().split("\nMore\n")[0]) and "Measured by each probe" in full.getvalue()

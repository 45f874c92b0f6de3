"""`%load_ext torchdoctor` and the `%%torchdoctor` cell magic (issue 17), in a real IPython shell.

Skipped, with the reason, where IPython is not installed (it is a test extra, not a dependency).
The last test runs a notebook that uses the magic through `torchdoctor run notebook.ipynb`: the magic's
cell is Python and runs under the run's own probes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import cli

pytestmark = pytest.mark.slow

SETUP = """import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []
"""
LEAK = """for _ in range(300):
    loss = model(torch.randn(128, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss)
"""
HEALTHY = """for _ in range(30):
    opt.zero_grad()
    model(torch.randn(16, 64)).pow(2).mean().backward()
    opt.step()
"""


@pytest.fixture
def shell():
    pytest.importorskip("IPython", reason="IPython is an optional test extra")
    from IPython.core.interactiveshell import InteractiveShell

    ipython = InteractiveShell.instance()
    ipython.run_line_magic("load_ext", "torchdoctor")
    assert ipython.run_cell(SETUP).success
    return ipython


def _cell(shell, line: str, body: str):
    result = shell.run_cell(f"%%torchdoctor {line}\n{body}")
    return result, shell.user_ns.get("_torchdoctor")


def test_a_healthy_cell_counts_its_steps_and_shows_its_report(shell, tmp_path, capsys):
    result, watch = _cell(shell, f"--out {tmp_path / 'run'}", HEALTHY)
    assert result.success
    assert "<torchdoctor.watch: 30 steps, completed; no symptoms>" in capsys.readouterr().out  # the cell's output
    report = watch.report()
    assert report.run.steps_completed == 30 and report.run.stopped == "completed"
    assert report.symptoms == [] and report.target == "%%torchdoctor cell"
    assert repr(watch) == "<torchdoctor.watch: 30 steps, completed; no symptoms>"
    assert "30 optimizer steps" in watch._repr_html_()
    assert (tmp_path / "run" / "report.json").is_file()


def test_a_leak_in_the_cell_is_named_at_the_cells_line(shell, tmp_path):
    result, watch = _cell(shell, f"--out {tmp_path / 'run'}", LEAK)
    assert result.success
    growth = [s for s in watch.report().symptoms if s.id == "memory-growth"]
    assert growth and growth[0].severity == "error"
    assert growth[0].location.path.startswith("<ipython-input-") and growth[0].location.line == 6


def test_steps_ends_the_cell_quietly(shell, tmp_path, capsys):
    result, watch = _cell(shell, f"--steps 3 --out {tmp_path / 'run'}", HEALTHY + "print('after the loop')\n")
    out = capsys.readouterr()
    assert "after the loop" not in out.out and "StopRun" not in out.out + out.err
    assert watch.report().run.stopped == "steps" and watch.report().run.steps_completed == 3
    assert shell.run_cell("1 + 1").result == 2  # the shell's exception handling is back to normal
    assert shell.custom_exceptions == ()


def test_an_exception_in_the_cell_is_diagnosed_and_shown_by_ipython(shell, tmp_path, capsys):
    result, watch = _cell(shell, f"--out {tmp_path / 'run'}", HEALTHY + "raise ValueError('bad cell')\n")
    assert isinstance(result.error_in_exec, ValueError) and not result.success  # the cell failed
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # IPython's colours
    assert shown.count("ValueError: bad cell") == 1  # IPython's own traceback, once
    report = watch.report()
    assert report.run.stopped == "crashed" and report.run.error.type == "ValueError"


def test_bad_options_are_one_line(shell, capsys):
    shell.user_ns.pop("_torchdoctor", None)
    result, watch = _cell(shell, "--steps many", HEALTHY)
    assert watch is None and result.success
    assert "%%torchdoctor: argument --steps: invalid int value: 'many'" in capsys.readouterr().out
    result, watch = _cell(shell, "--steps 0", HEALTHY)
    assert "steps must be a whole number of at least 1" in capsys.readouterr().out


def test_torchdoctor_run_runs_the_magics_cell_under_its_own_probes(tmp_path, validate_report):
    cells = [["%load_ext torchdoctor\n", *SETUP.splitlines(True)], ["%%torchdoctor --steps 100\n",
                                                                   *HEALTHY.splitlines(True)]]
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"language_info": {"name": "python"}},
                "cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": source} for source in cells]}
    path = tmp_path / "train.ipynb"
    path.write_text(json.dumps(notebook))
    proc = cli("run", str(path), "--out", str(tmp_path / "run"), "--format", "json", timeout=240)
    assert proc.returncode == 0, proc.stderr_text
    report = validate_report(proc.stdout_text)
    assert report["run"]["steps_completed"] == 30
    assert not Path(tmp_path / "run" / "report.json").read_text().count("%%torchdoctor cell")

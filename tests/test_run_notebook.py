"""`torchdoctor run notebook.ipynb`: the code cells run in order, magics skipped as `check` skips them,
from the notebook's folder, and every location names the notebook's cell and the line within it.

The notebooks are written by the tests (nbformat 4 JSON, sources as lists of lines, as Jupyter saves
them) into a folder of their own, next to a helper module they import; each run's folder is hashed
before and after: a run never writes next to the user's notebook.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.test_run_support import processes_of, tree_hash
from torchdoctor import exitcodes

HELPER = """import torch


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
"""

SETUP = [
    "%matplotlib inline\n",
    "import os, sys\n",
    "import torch\n",
    "from helper import make_model\n",
    "!nvidia-smi\n",
    "print('cwd', os.getcwd())\n",
    "print('path0', sys.path[0])",
]
MODEL = [
    "%%time\n",
    "model = make_model()\n",
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n",
    "x, y = torch.randn(16, 32), torch.randn(16, 1)",
]


def notebook(cells: list[tuple[str, list[str]]], language: str = "python") -> dict:
    """An nbformat 4 notebook as Jupyter writes it."""
    def cell(kind: str, source: list[str]) -> dict:
        extra = {"outputs": [], "execution_count": None} if kind == "code" else {}
        return {"cell_type": kind, "metadata": {}, "source": source, **extra}

    return {"nbformat": 4, "nbformat_minor": 5, "cells": [cell(k, s) for k, s in cells],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": language},
                         "language_info": {"name": language}}}


HEALTHY = [
    ("markdown", ["# A tiny training loop\n", "Twelve steps."]),
    ("code", SETUP),
    ("code", MODEL),
    ("code", ["%%bash\n", "echo this cell does not run"]),
    ("code", [
        "history = []\n",
        "for step in range(12):\n",
        "    optimizer.zero_grad()\n",
        "    loss = torch.nn.functional.mse_loss(model(x), y)\n",
        "    loss.backward()\n",
        "    optimizer.step()\n",
        "    history.append(loss.item())\n",
        "    if step == 0:\n",
        "        !echo first step done\n",
        "print('steps', len(history))",
    ]),
]

LEAKY = [
    ("code", SETUP),
    ("code", MODEL),
    ("code", [
        "losses = []\n",
        "for step in range(40):\n",
        "    optimizer.zero_grad()\n",
        "    loss = torch.nn.functional.mse_loss(model(x), y)\n",
        "    loss.backward()\n",
        "    optimizer.step()\n",
        "    losses.append(loss)",
    ]),
    ("markdown", ["Report the mean loss."]),
    ("code", ["%time total = sum(l.item() for l in losses)\n", "print('mean loss', total / len(lossses))"]),
]


def _run_notebook(root: Path, name: str, cells: list, *args: str):
    """Write proj/<name>.ipynb and helper.py under `root`, run it from `root`; the project's hashes around it."""
    project = root / "proj"
    project.mkdir(parents=True, exist_ok=True)
    (project / "helper.py").write_text(HELPER)
    (project / f"{name}.ipynb").write_text(json.dumps(notebook(cells), indent=1))
    before = tree_hash(project)
    run_dir = root / f"run-{name}"
    proc = cli("run", "--out", str(run_dir), "--format", "json", *args, f"proj/{name}.ipynb", cwd=root, timeout=120)
    report_file = run_dir / "report.json"
    return {
        "proc": proc,
        "report": json.loads(report_file.read_text()) if report_file.exists() else {},
        "run_dir": run_dir,
        "project": project,
        "changed": before != tree_hash(project),
        "leftover": processes_of(run_dir),
    }


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return _run_notebook(tmp_path_factory.mktemp("nb-healthy"), "train", HEALTHY)


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    return _run_notebook(tmp_path_factory.mktemp("nb-leaky"), "leak", LEAKY, "-p", "memory")


def _sound(result: dict, validate_report, code: int) -> None:
    proc = result["proc"]
    assert proc.returncode == code, proc.stderr_text[-3000:]
    validate_report(result["report"])
    assert json.loads(proc.stdout_text) == result["report"]
    assert result["leftover"] == []
    assert not result["changed"], "the run wrote into the notebook's folder"  # new files too (bytecode aside)


@pytest.mark.slow
def test_a_notebook_runs_its_code_cells_and_counts_its_steps(healthy, validate_report):
    _sound(healthy, validate_report, exitcodes.OK)
    run = healthy["report"]["run"]
    assert run["stopped"] == "completed" and run["exit_code"] == 0 and run["steps_completed"] == 12
    assert run["command"] == ["jupyter", "execute", "proj/train.ipynb"]
    assert healthy["report"]["target"] == "proj/train.ipynb"
    err = healthy["proc"].stderr_text  # --format json: the notebook's own output goes to stderr
    project = str(healthy["project"].resolve())
    assert f"cwd {project}\n" in err and f"path0 {project}\n" in err  # like a kernel started in its folder
    assert "steps 12\n" in err and "this cell does not run" not in err
    assert "first step done" not in err  # shell escapes are skipped, not run


@pytest.mark.slow
def test_magics_and_skipped_cells_are_named_and_the_converted_script_is_in_the_run_dir(healthy):
    notes = healthy["report"]["notes"]
    # %matplotlib, !nvidia-smi, %%time and the indented !echo: four lines skipped, as `check` skips them
    assert any("3 code cells" in n and "skipped 4 IPython magic or shell lines" in n for n in notes), notes
    assert any(n.startswith("Cell 4 did not run (cell magic %%bash)") for n in notes), notes
    script = (healthy["run_dir"] / "notebook.torchdoctor.py").read_text()
    assert "        pass\n" in script and "!echo" not in script and "%%bash" not in script
    assert "from helper import make_model" in script


@pytest.mark.slow
def test_a_leak_in_a_cell_is_reported_at_the_cell_and_its_line(leaky, validate_report):
    _sound(leaky, validate_report, exitcodes.SCRIPT_FAILED)  # the last cell's NameError: exit 4
    [growth] = [s for s in leaky["report"]["symptoms"] if s["id"] == "memory-growth"]
    where = growth["location"]
    assert (where["path"], where["cell"], where["line"], where["code"]) == (
        "proj/leak.ipynb", 3, 7, "losses.append(loss)")
    sources = {ev["source"]: ev["location"] for ev in growth["evidence"] if ev["location"]}
    assert sources["memory"]["cell"] == 3 and sources["memory"]["line"] == 7
    assert sources["TD101"]["cell"] == 3 and sources["TD101"]["line"] == 7  # check's rule, merged: same place
    assert "Cell 3, line 7 (`losses.append(loss)`)" in leaky["report"]["reports"][0]["diagnosis"]
    # `%time total = …` ran as the statement (a later line needs `total`), as `check` now reads it too
    assert any("ran 1 `%time`/`%timeit` line as plain Python" in n for n in leaky["report"]["notes"])


@pytest.mark.slow
def test_an_exception_in_a_cell_names_the_cell_and_shows_its_lines(leaky):
    run = leaky["report"]["run"]
    assert run["stopped"] == "crashed" and run["steps_completed"] == 40
    error = run["error"]
    assert error["type"] == "NameError" and "lossses" in error["message"]
    assert (error["location"]["path"], error["location"]["cell"], error["location"]["line"]) == (
        "proj/leak.ipynb", 5, 2)
    assert error["location"]["code"] == "print('mean loss', total / len(lossses))"
    cell = str(leaky["project"].resolve() / "leak.ipynb") + ":cell 5"
    # the traceback reads like Jupyter's: the cell and its own line, not the notebook's JSON
    assert f'File "{cell}", line 2, in <module>\n    print(\'mean loss\', total / len(lossses))' in \
        leaky["proc"].stderr_text


def test_the_text_report_names_cells_as_check_does(tmp_path):
    """`path:cell N:line`, the way `check` prints a notebook's finding (no run needed: the model's string)."""
    from torchdoctor.model import Location

    assert str(Location("train.ipynb", 7, cell=3)) == "train.ipynb:cell 3:7"
    assert str(Location("train.py", 7)) == "train.py:7"


@pytest.mark.parametrize(
    "content,fragment",
    [
        ('{"cells": [', "not a valid notebook: JSON error at line 1"),
        ('{"nbformat": 3, "nbformat_minor": 0, "worksheets": []}', "an nbformat 3 notebook"),
        ('["not", "a", "notebook"]', "not a valid notebook: no list of cells"),
        (json.dumps(notebook([("code", ["1 + 1"])], language="R")), "a R notebook, not Python"),
    ],
)
def test_a_notebook_that_cannot_be_read_is_refused_with_one_line(tmp_path, content, fragment):
    (tmp_path / "nb.ipynb").write_text(content)
    proc = cli("run", "nb.ipynb", cwd=tmp_path, timeout=60)
    assert proc.returncode == exitcodes.USAGE
    assert proc.stdout_text == ""
    lines = proc.stderr_text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchdoctor: cannot run the notebook nb.ipynb: ")
    assert fragment in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nb.ipynb"]  # no run directory was created


def test_check_names_an_old_notebook_format_too(tmp_path):
    (tmp_path / "old.ipynb").write_text('{"nbformat": 3, "nbformat_minor": 0, "worksheets": []}')
    proc = cli("check", "--format", "json", "old.ipynb", cwd=tmp_path, timeout=60)
    [finding] = json.loads(proc.stdout_text)["findings"]
    assert finding["code"] == "TD000" and "an nbformat 3 notebook" in finding["message"]


def test_a_notebook_cannot_be_launched_through_torchrun(tmp_path):
    (tmp_path / "nb.ipynb").write_text(json.dumps(notebook([("code", ["print(1)"])])))
    proc = cli("run", "--nproc-per-node", "2", "nb.ipynb", cwd=tmp_path, timeout=60)
    assert proc.returncode == exitcodes.USAGE
    assert "nb.ipynb is a notebook: a distributed run needs a script" in proc.stderr_text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nb.ipynb"]


def test_the_shared_reader_keeps_the_statement_of_a_time_magic():
    """`%time x = f()` defines x in Jupyter: `run` must run the statement, and `check`'s rules read it."""
    from torchdoctor.rules.static.sources import notebook_unit

    cells = [("code", ["%time model = make()\n", "for i in range(3):\n", "    %timeit step(model)\n",
                       "    %timeit -n 3 step(model)\n", "    !echo done"])]
    unit = notebook_unit("nb.ipynb", json.dumps(notebook(cells)).encode())
    assert unit.text.split("\n") == ["model = make()", "for i in range(3):", "    step(model)", "    pass",
                                     "    pass"]

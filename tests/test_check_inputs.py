"""Bad input never produces a traceback: each unreadable file gets TD000, the others are still
checked, and `check` never runs the code it reads."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import cli
from torchdoctor.rules.static import registry
from torchdoctor.rules.static.engine import Options, analyse_bytes, analyse_text

LEAK = (
    "import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "total = 0\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n    total += loss\n"
)


@pytest.fixture(scope="module")
def bad_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    marker = root / "MARKER"
    files = {
        "syntax_error.py": b"def f(:\n    pass\n",
        "latin1.py": "x = 'caf\xe9'\n".encode("latin-1"),
        "bad_cookie.py": b"# -*- coding: klingon -*-\nx = '\xe9'\n",
        "transform_codec.py": b"# -*- coding: future_fstrings -*-\n" + LEAK.encode(),
        "nul.py": b"x = 1\x00\n",
        "python2.py": b"print 'hello'\nexcept_ok = 1\n",
        "empty.py": b"",
        "deep_parens.py": ("x = " + "(" * 100_000 + "1" + ")" * 100_000 + "\n").encode(),
        "deep_binop.py": ("x = " + "1 + " * 100_000 + "1\n").encode(),
        "broken.ipynb": b'{"cells": [ {"cell_type": "code", "source": ',
        "not_a_notebook.ipynb": b'["just", "a", "list"]',
        "runs_if_imported.py": (
            f"open({str(marker)!r}, 'w').write('executed')\n"
            f"import os\nos.system('touch {marker}')\n"
            "if __name__ == '__main__':\n    open('MARKER', 'w')\n"
        ).encode(),
        "leak.py": LEAK.encode(),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    # 5 MB of valid Python: over the default 2 MiB limit.
    (root / "huge.py").write_bytes(b"x = 1\n" * (5 * 2**20 // 6 + 1))
    return root, marker


@pytest.fixture(scope="module")
def bad_report(bad_tree):
    root, _ = bad_tree
    proc = cli("check", "--format", "json", ".", cwd=root)
    return proc, json.loads(proc.stdout_text)


def td000(report):
    return {f["path"]: f["message"] for f in report["findings"] if f["code"] == "TD000"}


def test_no_traceback_and_every_bad_file_reported(bad_report, validate_report):
    proc, report = bad_report
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr_text and proc.stderr_text == ""
    validate_report(report)
    messages = td000(report)
    assert set(messages) == {
        "syntax_error.py",
        "latin1.py",
        "bad_cookie.py",
        "nul.py",
        "python2.py",
        "deep_parens.py",
        "deep_binop.py",
        "broken.ipynb",
        "not_a_notebook.ipynb",
        "huge.py",
    }
    assert "syntax error at line 1" in messages["syntax_error.py"]
    assert "not valid utf-8 text at byte 8" in messages["latin1.py"]
    assert "not valid utf-8 text" in messages["bad_cookie.py"]  # an unknown codec: read as UTF-8, which it is not
    assert "NUL bytes" in messages["nul.py"]
    assert "(Python 2 code?)" in messages["python2.py"]
    assert "too many nested parentheses" in messages["deep_parens.py"]
    assert "nested too deeply" in messages["deep_binop.py"]
    assert "JSON error at line 1" in messages["broken.ipynb"]
    assert "no list of cells" in messages["not_a_notebook.ipynb"]
    assert "5.0 MiB, over the 2.0 MiB limit" in messages["huge.py"]
    assert "Checked 14 files (10 could not be analysed)" in report["notes"][0]


def test_other_files_are_still_checked(bad_report):
    _, report = bad_report
    found = {(f["path"], f["code"], f["line"]) for f in report["findings"]}
    assert ("leak.py", "TD101", 9) in found
    assert ("transform_codec.py", "TD101", 10) in found  # a source-transform codec's file is read as UTF-8
    assert not [f for f in report["findings"] if f["path"] in ("empty.py", "runs_if_imported.py")]
    assert not [s for s in report["symptoms"] if s["id"] == "source-not-analysed"]  # TD000 is not a symptom


def test_check_never_executes_the_code(bad_tree, bad_report):
    root, marker = bad_tree
    assert not marker.exists() and not (root / "MARKER").exists()


def test_max_file_bytes_can_be_raised(tmp_path):
    (tmp_path / "big.py").write_bytes(b"x = 1\n" + (b"# " + b"-" * 254 + b"\n") * 12_000)  # 3 MiB, few nodes
    (tmp_path / "pyproject.toml").write_text("[tool.torchdoctor]\nmax-file-bytes = 8_000_000\n")
    proc = cli("check", "big.py", cwd=tmp_path)
    assert proc.returncode == 0 and "Checked 1 file: no findings." in proc.stdout_text


def _notebook(code: str, output_bytes: int) -> bytes:
    """A notebook with one code cell and one saved output of about `output_bytes` (an embedded PNG)."""
    output = {"output_type": "display_data", "metadata": {}, "data": {"image/png": "A" * output_bytes}}
    cell = {"cell_type": "code", "metadata": {}, "execution_count": 1, "source": code, "outputs": [output]}
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [cell]}).encode()


def test_notebook_size_limit_counts_its_code_not_its_outputs(tmp_path):
    # A lesson notebook is mostly saved plots: 3 MiB on disk, a few hundred bytes of code, which is analysed.
    (tmp_path / "lesson.ipynb").write_bytes(_notebook(LEAK, 3 * 2**20))
    report = json.loads(cli("check", "--format", "json", "lesson.ipynb", cwd=tmp_path).stdout_text)
    assert td000(report) == {}
    assert ("TD101", 1, 9) in {(f["code"], f["cell"], f["line"]) for f in report["findings"]}


def test_notebook_code_over_the_limit_and_huge_notebooks_are_not_analysed(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.torchdoctor]\nmax-file-bytes = 100_000\n")
    (tmp_path / "long.ipynb").write_bytes(_notebook("x = 1\n" * 40_000, 0))  # 240 kB of code
    (tmp_path / "huge.ipynb").write_bytes(_notebook(LEAK, 2_000_000))  # over 16 times the limit on disk
    report = json.loads(cli("check", "--format", "json", ".", cwd=tmp_path).stdout_text)
    messages = td000(report)
    assert messages["long.ipynb"].startswith("could not analyse: its code is 0.2 MiB, over the 0.1 MiB limit")
    assert messages["huge.ipynb"].startswith("could not analyse: the file is 1.9 MiB, over the 1.5 MiB limit")


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 parses PEP 701 f-strings")
def test_a_python_312_f_string_is_named_as_such(tmp_path):
    # facebookresearch/lingua apps/mtp/train.py:138: double quotes inside the braces of a double-quoted f-string.
    (tmp_path / "train.py").write_text('from pathlib import Path\nd = "x"\nprint(f"at {str(Path(d) / "ckpt")}")\n')
    message = td000(json.loads(cli("check", "--format", "json", "train.py", cwd=tmp_path).stdout_text))["train.py"]
    assert message.startswith("could not analyse: the f-string at line 3 does not parse on Python 3.1")
    assert "Python 3.12 and later accept quotes" in message and "syntax error" not in message


def test_missing_path_is_a_usage_error(tmp_path):
    (tmp_path / "train.py").write_text("x = 1\n")
    proc = cli("check", "train.py", "missing_dir/", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr_text == "torchdoctor: no such file or directory: missing_dir/\n"


@pytest.fixture
def special_files(tmp_path):
    """A named pipe, a Unix socket and a character device, each named like a script."""
    import os
    import socket

    os.mkfifo(tmp_path / "pipe.py")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.py"))
    (tmp_path / "zero.py").symlink_to("/dev/zero")  # reading it never ends; the walk must skip it
    (tmp_path / "leak.py").write_text(LEAK)
    yield tmp_path
    sock.close()


def test_non_regular_files_on_the_command_line_are_refused(special_files):
    """A FIFO, a socket or a device named on the command line is a TD000 finding, never a read that
    blocks or never ends; the regular file beside them is still checked."""
    proc = cli("check", "--format", "json", "pipe.py", "sock.py", "/dev/zero", "leak.py",
               cwd=special_files, timeout=30)
    assert proc.returncode == 1 and proc.stderr_text == ""
    report = json.loads(proc.stdout_text)
    messages = td000(report)
    assert messages["pipe.py"].endswith("a named pipe (FIFO), not a regular file: not read (`-` reads standard input)")
    assert "a socket, not a regular file" in messages["sock.py"]
    assert "a character device, not a regular file" in messages["/dev/zero"]
    assert any(f["code"] == "TD101" and f["path"] == "leak.py" for f in report["findings"])


def test_a_directory_walk_skips_non_regular_files(special_files):
    proc = cli("check", "--format", "json", ".", cwd=special_files, timeout=30)
    report = json.loads(proc.stdout_text)
    assert proc.returncode == 1 and td000(report) == {}
    assert {f["path"] for f in report["findings"]} == {"leak.py"}


def test_symlink_problems_are_named(tmp_path):
    (tmp_path / "a.py").symlink_to("b.py")
    (tmp_path / "b.py").symlink_to("a.py")
    (tmp_path / "dangling.py").symlink_to("gone.py")
    (tmp_path / "train.py").write_text("x = 1\n")
    proc = cli("check", "train.py", "a.py", cwd=tmp_path)
    assert (proc.returncode, proc.stdout_text) == (2, "")
    assert proc.stderr_text == "torchdoctor: a symlink loop (it never reaches a file): a.py\n"
    proc = cli("check", "dangling.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr_text == "torchdoctor: a broken symlink (its target 'gone.py' does not exist): dangling.py\n"


def test_closed_or_endless_stdin(tmp_path):
    """`check -` with standard input closed is one line and exit 2; an endless one is read only to the limit."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "torchdoctor.cli", "check", "--format", "json", "-"]
    proc = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, cwd=tmp_path,
                          preexec_fn=lambda: os.close(0))
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode() == ("torchdoctor: standard input is closed: pipe the source in, "
                                    "e.g. `cat train.py | torchdoctor check -`.\n")
    with open("/dev/zero", "rb") as zeros:
        proc = subprocess.run(command, stdin=zeros, capture_output=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert td000(json.loads(proc.stdout)) == {"-": "could not analyse: the input is over the 2.0 MiB limit"}


def test_empty_directory(tmp_path):
    proc = cli("check", str(tmp_path))
    assert proc.returncode == 0 and "No Python files or notebooks found" in proc.stdout_text


def test_ten_thousand_files(tmp_path):
    """Many small files: all checked, across worker processes, with results in a stable order."""
    for i in range(10_000):
        body = "model = torch.nn.Linear(2, 2)\ny = model.forward(x)\n" if i % 1000 == 7 else "import torch\nx = 1\n"
        (tmp_path / f"m{i:05d}.py").write_text(body)
    (tmp_path / "broken.py").write_text("def (:\n")
    proc = cli("check", "--format", "json", "--select", "TD202", ".", cwd=tmp_path, timeout=300)
    report = json.loads(proc.stdout_text)
    assert proc.returncode == 1, proc.stderr_text
    assert report["notes"][0] == "Checked 10001 files (1 could not be analysed): 1 error, 10 warnings."
    assert [f["path"] for f in report["findings"] if f["code"] == "TD202"] == [f"m{i:05d}.py" for i in range(7, 10_000, 1000)]
    single = cli("check", "--statistics", "--select", "TD202", "--jobs", "1", ".", cwd=tmp_path, timeout=300)
    assert single.stdout_text.split() == ["10", "TD202", "warning", "forward-called-directly", "1", "TD000", "error", "could-not-analyse"]


python_like = st.lists(
    st.sampled_from(
        [
            "import torch\n", "from torch import nn\n", "import torch.nn.functional as F\n", "for x in loader:\n",
            "    loss = model(x)\n", "    loss.backward()\n", "    total += loss\n", "    optimizer.step()\n",
            "class M(nn.Module):\n", "    def __init__(self):\n", "        self.l = [nn.Linear(2, 2)]\n",
            "    def forward(self, x):\n", "        return F.softmax(x @ x.transpose(-2, -1), -1) @ x\n",
            "with torch.no_grad():\n", "    pass\n", "if rank == 0:\n", "def f(\n", ")\n", "x = (\n", "'''\n",
            "\t", "  ", "lambda: (yield)\n", "async def g():\n", "    await h()\n", "x = y = z\n", "del x\n",
            "@torch.no_grad()\n", "try:\n", "except Exception as e:\n", "global q\n", "x[1:2, ...] = 3\n",
            "model.forward(x)\n", "torch.cuda.empty_cache()\n", "a, *b = c\n", "print(f'{x!r:>{w}}')\n",
        ]
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(python_like.map("".join), st.text(max_size=300)))
def test_engine_never_raises_on_generated_source(source):
    result = analyse_text(source, "gen.py")
    for r in result.results:
        assert r.finding.code in registry.rules()
        if r.finding.code == "TD000":
            assert r.finding.message.startswith("could not analyse: ")
            assert "please report it" not in r.finding.message, r.finding.message


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["gen.py", "gen.ipynb"]))
def test_engine_never_raises_on_generated_bytes(data, name):
    options = Options(codes=tuple(registry.rules()), torch_version=(2, 13))
    result = analyse_bytes(data, name, options)
    assert all(r.finding.code in registry.rules() for r in result.results)


def test_warnings_from_the_parser_stay_quiet(capfd):
    analyse_text('x = "\\d"\nassert (x, "always true")\n')
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_rules_broken_message_template_is_its_own_td000_and_the_others_still_report(monkeypatch):
    """A rule whose message names a value its report() did not give (a bug of ours) costs that one finding,
    as a TD000 naming the rule, never the run: the other rules' findings on the file still come out."""
    import dataclasses

    table = registry.rules()
    leak = next(r for r in table.values() if r.doc.symptom == "memory-growth" and r.check is not None
                and analyse_text(LEAK, codes=[r.code]).results)
    broken = dataclasses.replace(leak, doc=dataclasses.replace(leak.doc, message=leak.doc.message + " {no_such}"))
    monkeypatch.setitem(table, leak.code, broken)
    other = [c for c in table if c not in ("TD000", leak.code)]
    result = analyse_text(LEAK, codes=[leak.code, *other])
    codes = [r.finding.code for r in result.results]
    internal = [r for r in result.results if r.finding.code == "TD000"]
    assert len(internal) == 1 and leak.code in internal[0].finding.message, codes
    assert "KeyError" in internal[0].finding.message
    clean = analyse_text(LEAK, codes=other)
    assert sorted(c for c in codes if c != "TD000") == sorted(r.finding.code for r in clean.results)



def test_the_garbage_collector_is_paused_for_a_file_and_left_as_the_caller_had_it(monkeypatch):
    """The engine pauses the cyclic collector while it analyses a file (engine.analyse_unit): on again afterwards,
    also after a syntax error or a rule that raised, and still off for a caller that had turned it off."""
    import dataclasses
    import gc

    table = registry.rules()
    seen: list[bool] = []

    def failing(node, ctx):
        seen.append(gc.isenabled())
        raise RuntimeError("a bug of ours")

    code = next(c for c, r in table.items() if r.check is not None)
    monkeypatch.setitem(table, code, dataclasses.replace(table[code], check=failing))
    assert gc.isenabled()
    result = analyse_text(LEAK, codes=[code])
    assert seen and not any(seen)
    assert [r.finding.code for r in result.results] == ["TD000"] and gc.isenabled()
    analyse_text("def f(:\n")
    assert gc.isenabled()
    gc.disable()
    try:
        analyse_text(LEAK)
        assert not gc.isenabled()
    finally:
        gc.enable()

def test_a_shell_command_continued_with_backslashes_is_one_shell_line():
    # Qwen's fine-tuning notebooks: `!python finetune.py \` with an indented option on each following line. The
    # continuation lines are shell text: they become `pass` like the first, and the rest of the cell is analysed.
    from torchdoctor.rules.static.sources import notebook_unit

    code = "!export CUDA_VISIBLE_DEVICES=0\n!python finetune.py \\\n    --bf16 \\\n    --lr 1e-5\n" + LEAK
    unit = notebook_unit("ft.ipynb", _notebook(code, 0))
    lines = unit.text.split("\n")
    assert lines[:4] == ["pass"] * 4 and lines[4] == "import torch"
    options = Options(codes=tuple(registry.rules()), torch_version=(2, 13))
    found = {(r.finding.code, r.finding.line) for r in analyse_bytes(_notebook(code, 0), "ft.ipynb", options).results}
    assert not [f for f in found if f[0] == "TD000"] and ("TD101", 13) in found, found
    # A Python line ending in a backslash after a shell line is not carried: only the shell line continues.
    unit = notebook_unit("ft.ipynb", _notebook("!ls\nx = 1 + \\\n    2\n", 0))
    assert unit.text.split("\n") == ["pass", "x = 1 + \\", "    2", ""]


def test_a_cell_that_starts_indented_is_read_as_ipython_runs_it():
    # A tutorial notebook's cell pasted with one stray space before `trigram = [...]`: Jupyter takes the first
    # line's indentation off the whole cell and runs it, so it is no syntax error (TD000) and its code is read.
    from torchdoctor.rules.static.sources import notebook_unit

    code = "\n " + LEAK.replace("\n", "\n ")
    unit = notebook_unit("tutorial.ipynb", _notebook(code, 0))
    assert unit.text.split("\n")[:2] == ["", "import torch"]
    options = Options(codes=tuple(registry.rules()), torch_version=(2, 13))
    found = {(r.finding.code, r.finding.line) for r in analyse_bytes(_notebook(code, 0), "tutorial.ipynb", options).results}
    assert not [f for f in found if f[0] == "TD000"] and any(c == "TD101" for c, _ in found), found
    # A cell whose own block is indented after an unindented first line keeps its indentation: a real error stays one.
    broken = notebook_unit("tutorial.ipynb", _notebook("x = 1\n  y = 2\n", 0))
    assert broken.text.split("\n")[:2] == ["x = 1", "  y = 2"]


def test_a_percent_operator_on_a_continuation_line_is_python_not_a_magic():
    # d2l's notebooks: `print('epoch %d, loss %.4f'` then `      % (epoch + 1, l))` on the next line. Inside an
    # open bracket, a triple-quoted string or after a backslash, IPython reads `%` as the operator, and so do we;
    # a magic at the start of a statement after the bracket closes is still a magic.
    from torchdoctor.rules.static.sources import notebook_unit

    code = ("for epoch in range(2):\n    print('epoch %d, loss %f'\n          % (epoch + 1, 0.5))\n"
            "x = 'a' \\\n    % ()\ndoc = \"\"\"(\n% not a magic\n\"\"\"\n%matplotlib inline\n" + LEAK)
    lines = notebook_unit("d2l.ipynb", _notebook(code, 0)).text.split("\n")
    assert lines[2] == "          % (epoch + 1, 0.5))" and lines[4] == "    % ()" and lines[6] == "% not a magic"
    assert lines[8] == "pass", lines[:9]
    options = Options(codes=tuple(registry.rules()), torch_version=(2, 13))
    found = {(r.finding.code, r.finding.line) for r in analyse_bytes(_notebook(code, 0), "d2l.ipynb", options).results}
    assert not [f for f in found if f[0] == "TD000"] and any(c == "TD101" for c, _ in found), found


def test_a_databricks_notebook_exported_as_python_has_its_shell_lines_neutralised():
    # dolly's train_dolly.py: `# Databricks notebook source`, then cells with `!deepspeed ... \` continued over
    # several lines. Without the header the same text is a syntax error (TD000), as it would be for Python.
    from torchdoctor.rules.static.sources import unit_from_bytes

    body = "!deepspeed {flags} \\\n    --module training.trainer \\\n    --epochs 2\n\n# COMMAND ----------\n" + LEAK
    options = Options(codes=tuple(registry.rules()), torch_version=(2, 13))
    exported = ("# Databricks notebook source\n" + body).encode()
    assert unit_from_bytes("train.py", exported).text.split("\n")[1:4] == ["pass"] * 3
    found = {(r.finding.code, r.finding.line) for r in analyse_bytes(exported, "train.py", options).results}
    assert ("TD101", 15) in found and not any(code == "TD000" for code, _ in found), found
    plain = {r.finding.code for r in analyse_bytes(body.encode(), "train.py", options).results}
    assert plain == {"TD000"}

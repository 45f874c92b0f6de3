"""The compile probe on real scripts (with --compile-backend eager, so dynamo's findings come in seconds):
a print and a data-dependent branch in a compiled forward break the graph at their lines; varying
sequence lengths through a Python loop over the length recompile; a static, clean model raises neither."""

from __future__ import annotations

import pytest

from tests.conftest import cli
from tests.test_run_support import RUN_FIXTURES, assert_sound, line_of, shared_run
from torchdoctor import exitcodes
from torchdoctor.probes.compile import parse_graph_break, parse_limit, parse_recompile

pytestmark = pytest.mark.slow


def compiled(tmp_path_factory, name: str, script: str):
    return shared_run(tmp_path_factory, f"compile-{name}", script, "--probe", "compile", "--compile-backend", "eager")


@pytest.fixture(scope="module")
def breaks(tmp_path_factory):
    return compiled(tmp_path_factory, "breaks", "compile_breaks.py")


@pytest.fixture(scope="module")
def recompiles(tmp_path_factory):
    return compiled(tmp_path_factory, "recompile", "compile_recompile.py")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return compiled(tmp_path_factory, "healthy", "compile_healthy.py")


def test_print_and_data_dependent_branch_break_the_graph(breaks, validate_report):
    assert_sound(breaks, validate_report, exitcodes.OK)  # warnings
    [symptom] = breaks.symptoms("graph-break")
    assert symptom["severity"] == "warning" and symptom["specialist"] == "profiling"
    print_line = line_of("compile_breaks.py", 'print("forward pass")')
    branch_line = line_of("compile_breaks.py", "if h.sum() > 0:")
    sites = {(e["location"]["line"], e["values"]["reason"]) for e in symptom["evidence"]}
    assert sites == {(print_line, "Failed to trace builtin operator"), (branch_line, "Data-dependent branching")}
    values = symptom["evidence"][0]["values"]
    assert values["graph_breaks"] == 2 and values["file"] == "compile_breaks.py"
    assert symptom["location"]["line"] == print_line and "print" in values["explanation"]
    assert "compile" in breaks.report["contexts"]
    assert "Graph break in user code" not in breaks.stderr  # dynamo's log goes to us, not the script's stderr
    assert any("backend 'eager' instead of inductor" in note for note in breaks.report["notes"])


def test_varying_lengths_recompile_with_the_failing_guard(recompiles, validate_report):
    assert_sound(recompiles, validate_report, exitcodes.OK)
    [symptom] = recompiles.symptoms("recompile")
    values = symptom["evidence"][0]["values"]
    assert values["function"] == "forward" and values["recompiles"] >= 2  # lengths 4, 5, 6, 7, 8
    assert "size mismatch at index 1" in values["guard"] and "tensor 'x'" in values["guard"]
    assert symptom["location"]["line"] == line_of("compile_recompile.py", "def forward(self, x):")
    assert not recompiles.symptoms("graph-break")


def test_static_shapes_raise_nothing(healthy, validate_report):
    assert_sound(healthy, validate_report, exitcodes.OK)
    assert not healthy.symptoms("graph-break") and not healthy.symptoms("recompile")
    m = healthy.run["measurements"]["compile"]
    assert m["compile_calls"] == 1 and m["unique_graphs"] == 1 and m["graph_break_sites"] == 0
    assert m["backend_forced"] == "eager"


def test_compile_backend_must_be_known(tmp_path):
    proc = cli("run", "compile_healthy.py", "--compile-backend", "fast", "--out", str(tmp_path), cwd=RUN_FIXTURES)
    assert proc.returncode == exitcodes.USAGE
    assert proc.stderr_text.strip().splitlines() == [
        "torchdoctor: --compile-backend 'fast': choose one of: eager, aot_eager, inductor"]
    assert not list(tmp_path.iterdir())  # nothing was started


def test_parsers_read_dynamos_own_wording():
    """The messages as torch 2.13 writes them (torch/_dynamo/symbolic_convert.py, guards.py, convert_frame.py)."""
    gb = parse_graph_break(
        "Graph break (user stack suppressed due to duplicate graph break) in user code at /p/train.py:17\n"
        "Graph Break Reason: Data-dependent branching\n  Explanation: Detected data-dependent branching.")
    assert gb == {"kind": "graph-break", "duplicate": True, "path": "/p/train.py", "line": 17,
                  "reason": "Data-dependent branching", "explanation": "Detected data-dependent branching."}
    rc = parse_recompile("Recompiling function forward in /p/m.py:11\n    triggered by the following guard "
                         "failure(s):\n    - 0/1: tensor 'x' size mismatch at index 1. expected 5, actual 6\n"
                         "    - 0/0: tensor 'x' size mismatch at index 1. expected 4, actual 6")
    assert rc["function"] == "forward" and rc["line"] == 11 and len(rc["guards"]) == 2
    assert rc["guard"] == "tensor 'x' size mismatch at index 1. expected 5, actual 6"
    limit = parse_limit("torch._dynamo hit config.recompile_limit (8)\n   function: 'forward' (/p/m.py:11)\n"
                        "   last reason: 0/7: tensor 'x' size mismatch at index 1. expected 12, actual 13\n")
    assert limit["limit"] == 8 and limit["function"] == "forward" and limit["line"] == 11
    assert limit["last_reason"].endswith("expected 12, actual 13")

"""`torchdoctor ask` through the real CLI: questions (terminal, --answer, pipes), bad input, JSON."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, cli
from torchdoctor import exitcodes

VAGUE = "my model doesn't work"


def assert_clean_usage_error(proc, *fragments: str) -> None:
    assert proc.returncode == exitcodes.USAGE, (proc.returncode, proc.stderr_text)
    assert "Traceback" not in proc.stderr_text
    lines = [line for line in proc.stderr_text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("torchdoctor: "), proc.stderr_text
    for fragment in fragments:
        assert fragment in lines[0]


# -- questions ---------------------------------------------------------------


def test_piped_vague_text_prints_the_question_and_exits_3(validate_report):
    proc = cli("ask", "--format", "json", VAGUE)
    assert proc.returncode == exitcodes.QUESTION
    report = validate_report(proc.stdout_text)
    assert report["question"]["id"] == "what-is-broken"
    assert 3 <= len(report["question"]["choices"]) <= 5
    assert report["route"] == [] and report["reports"] == [] and report["symptoms"] == []


def test_question_in_text_format_lists_choices():
    proc = cli("ask", "optimize my model")
    assert proc.returncode == exitcodes.QUESTION
    assert "Optimize what" in proc.stdout_text and "--answer" in proc.stdout_text


def test_answer_continues_the_triage(validate_report):
    proc = cli("ask", "--format", "json", "--answer", "2", VAGUE)
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    report = validate_report(proc.stdout_text)
    assert report["question"] is None
    assert report["route"][0]["specialist"] == "debugging"
    assert report["symptoms"][0]["id"] == "nan-loss"
    assert report["reports"] and report["reports"][0]["diagnosis"]


def test_answer_of_the_distributed_question_keeps_the_distributed_context(validate_report):
    report = validate_report(cli("ask", "-f", "json", "-a", "4", "setup distributed training").stdout_text)
    assert report["route"][:2] == [
        {**report["route"][0], "specialist": "distributed"},
        {**report["route"][1], "specialist": "memory"},
    ]
    assert "distributed" in report["contexts"]


def test_answer_without_symptoms_asks_for_the_error(validate_report):
    report = validate_report(cli("ask", "-f", "json", "--answer", "1", VAGUE).stdout_text)
    assert report["symptoms"] == [] and any("torchdoctor ask -" in note for note in report["notes"])


@pytest.mark.parametrize("answer", ["0", "6", "-1", "99"])
def test_out_of_range_answer_is_a_usage_error(answer):
    assert_clean_usage_error(cli("ask", "--answer", answer, VAGUE), "--answer")


def test_answer_is_ignored_when_no_question_is_needed(validate_report):
    proc = cli("ask", "-f", "json", "--answer", "9", "loss becomes NaN after epoch 3")
    assert proc.returncode == exitcodes.OK
    assert validate_report(proc.stdout_text)["route"][0]["specialist"] == "debugging"


def run_on_terminal(args: list[str], keystrokes: list[bytes], timeout: float = 60) -> tuple[int, str]:
    """Run the CLI with stdin/stdout/stderr on a pseudo-terminal, typing `keystrokes` at each prompt."""
    master, slave = pty.openpty()
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120", "TERM": "dumb"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchdoctor.cli", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
        close_fds=True,
    )
    os.close(slave)
    output = b""
    pending = list(keystrokes)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
                if pending and output.rstrip().endswith(b"skip):"):
                    os.write(master, pending.pop(0))
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=10)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return rc, output.decode("utf-8", "replace").replace("\r\n", "\n")


def test_terminal_asks_interactively_and_continues_with_the_answer():
    rc, out = run_on_terminal(["ask", "--details", VAGUE], [b"2\n"])
    assert rc == exitcodes.OK, out
    assert "What is broken" in out and "1. " in out and "Choose 1-5" in out
    assert "Debugging" in out  # the report for the chosen area followed
    assert "Traceback" not in out


def test_terminal_reasks_after_a_bad_answer():
    rc, out = run_on_terminal(["ask", "--details", "optimize my model"], [b"banana\n", b"1\n"])
    assert rc == exitcodes.OK, out
    assert "Please type a number from 1 to 4" in out
    assert "Performance profiling" in out


def test_terminal_without_an_answer_prints_the_question_and_exits_3():
    rc, out = run_on_terminal(["ask", VAGUE], [b"\n"])
    assert rc == exitcodes.QUESTION, out
    assert "--answer" in out


# -- bad input ----------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   ", "\n\t\n"])
def test_empty_or_blank_text(text):
    assert_clean_usage_error(cli("ask", text), "empty")


def test_empty_stdin():
    assert_clean_usage_error(cli("ask", "-", input=b""), "empty")


def test_one_megabyte_on_stdin():
    assert_clean_usage_error(cli("ask", "-", input=b"loss is nan\n" * 90_000), "KiB")


def test_binary_with_nul_bytes_on_stdin():
    assert_clean_usage_error(cli("ask", "-", input=b"\x7fELF\x02\x01\x01\x00\x00\x00binary"), "NUL")


def test_non_utf8_on_stdin():
    assert_clean_usage_error(cli("ask", "-", input=b"loss is \xff\xfe nan"), "UTF-8")


def test_non_utf8_in_argv():
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor.cli", "ask", b"loss \xff nan"],
        capture_output=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=60,
    )
    proc.stderr_text = proc.stderr.decode("utf-8", "replace")
    assert_clean_usage_error(proc, "UTF-8")


def test_nul_bytes_are_refused_as_binary():
    assert_clean_usage_error(cli("ask", "-", input=b"loss \x00 nan"), "NUL")


@pytest.mark.parametrize("char", ["\x07", "\x1b", "\x0b", "\x0c", "\x08"])
def test_a_stray_control_character_is_stripped_not_refused(char):
    """A pasted log with a terminal bell, a form feed or a lone escape is still a log: it is read."""
    log = (
        f"epoch 3{char}\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 12, in <module>\n'
        "    loss.backward()\n"
        f"RuntimeError: Function 'LogBackward0' returned nan values in its 0th output.{char}\n"
    )
    proc = cli("ask", "--format", "json", "-", input=log.encode())
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    report = json.loads(proc.stdout_text)
    assert report["route"][0]["specialist"] == "debugging"
    assert char not in proc.stdout_text


def test_text_that_is_mostly_control_characters_is_refused_as_binary():
    assert_clean_usage_error(cli("ask", "-", input=bytes(range(1, 32)) * 20), "binary")


@pytest.mark.parametrize("args", [["-"], [], ["--format", "json", VAGUE]])
def test_closed_stdin_is_a_usage_error_not_a_crash(args):
    """`torchdoctor ask - <&-`: Python starts with sys.stdin = None; reading it or asking it isatty()
    must end in one line and exit 2 (or, for text given as arguments, in the normal answer)."""
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor.cli", "ask", *args],
        stdin=subprocess.DEVNULL, capture_output=True, env={**os.environ, "NO_COLOR": "1"}, timeout=60,
        preexec_fn=lambda: os.close(0),
    )
    proc.stdout_text = proc.stdout.decode("utf-8", "replace")
    proc.stderr_text = proc.stderr.decode("utf-8", "replace")
    if args and args[0] == "--format":
        assert proc.returncode == exitcodes.QUESTION and proc.stderr_text == ""
        assert json.loads(proc.stdout_text)["question"]["id"] == "what-is-broken"
    elif args:
        assert_clean_usage_error(proc, "standard input is closed")
    else:
        assert_clean_usage_error(proc, "nothing to triage")


def test_endless_stdin_is_refused_without_reading_it_all():
    """`yes | torchdoctor ask -` ends: standard input is read only up to the limit."""
    writer = subprocess.Popen(["yes", "loss is nan"], stdout=subprocess.PIPE)
    try:
        proc = subprocess.run([sys.executable, "-m", "torchdoctor.cli", "ask", "-"], stdin=writer.stdout,
                              capture_output=True, timeout=60)
    finally:
        writer.kill()
        writer.wait()
    proc.stderr_text = proc.stderr.decode("utf-8", "replace")
    assert_clean_usage_error(proc, "over 512 KiB")


def test_unknown_format():
    assert_clean_usage_error(cli("ask", "--format", "xml", "OOM after a few batches"), "xml")


def test_dash_mixed_with_text():
    assert_clean_usage_error(cli("ask", "-", "OOM", input=b"OOM"), "`-`")


def test_ansi_colours_and_progress_bars_are_cleaned_not_rejected(validate_report):
    log = (
        b"\x1b[32mEpoch 1\x1b[0m\n"
        b"  3%|3         | 30/1000 [00:03<01:40,  9.7it/s]\r  4%|4         | 40/1000 [00:04<01:39,  9.7it/s]\r\n"
        b"\x1b[31mRuntimeError: mat1 and mat2 shapes cannot be multiplied (32x512 and 256x10)\x1b[0m\n"
    )
    proc = cli("ask", "--format", "json", "-", input=log)
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    report = validate_report(proc.stdout_text)
    assert report["symptoms"][0]["id"] == "shape-mismatch"
    assert report["symptoms"][0]["evidence"][0]["values"]["input_features"] == 512
    assert "\x1b" not in proc.stdout_text


# -- JSON --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "OOM in distributed training",
        "RuntimeError: Error(s) in loading state_dict for ResNet: Missing key(s) in state_dict: \"conv1.weight\". Unexpected key(s) in state_dict: \"module.conv1.weight\".",
        "torch._dynamo hit config.recompile_limit (8) function: 'forward'. Last reason: tensor 'x' size mismatch at index 1. expected 128, actual 131",
        "trainign is sooo slow",
    ],
)
def test_json_reports_validate_and_carry_the_values(text, validate_report):
    proc = cli("ask", "--format", "json", text)
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    report = validate_report(proc.stdout_text)
    assert report["route"] and report["reports"]
    json.dumps(report)


def test_pasted_traceback_through_stdin(validate_report):
    text = (ROOT / "tests" / "fixtures" / "triage" / "ddp_unused_parameters.log").read_bytes()
    proc = cli("ask", "-f", "json", "-", input=text)
    assert proc.returncode == exitcodes.OK, proc.stderr_text
    report = validate_report(proc.stdout_text)
    assert [s["specialist"] for s in report["route"]][:2] == ["distributed", "module-design"]
    values = report["symptoms"][0]["evidence"][0]["values"]
    assert values["unused_parameters"] == ["b.bias", "b.weight"]

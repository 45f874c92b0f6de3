"""`run.stopped`: every value, defined once (rules/data/stopped.toml), reached by a real script and
rendered the same way by every renderer; the schema and docs/run.md list the same values."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, cli
from tests.test_run_support import RUN_FIXTURES, processes_of
from torchdoctor import exitcodes
from torchdoctor.stopped import endings

EXIT = {"ok": exitcodes.OK, "failed": exitcodes.SCRIPT_FAILED, "interrupted": exitcodes.INTERRUPTED}

# how the script ends, torchdoctor's options -> the value of `stopped`, the exit code, the signal
CASES = [
    ("return", [], "completed", 0, None),
    ("train", ["--steps", "3"], "steps", 0, None),
    ("sys.exit(3)", [], "exited", 3, None),
    ("os._exit(5)", [], "exited", 5, None),
    ("raise", [], "crashed", 1, None),
    ("abort", [], "crashed", None, "SIGABRT"),
    ("sigkill", [], "killed", None, "SIGKILL"),
    ("train", ["--timeout", "4"], "timeout", 143, "SIGTERM"),  # the bootstrap's exit on SIGTERM
    ("sleep", ["--hang-timeout", "2"], "hang", 143, "SIGTERM"),
    ("train", ["<Ctrl-C>"], "interrupted", 130, "SIGINT"),  # KeyboardInterrupt's exit
]


def test_every_value_is_reached_by_a_case():
    assert sorted({case[2] for case in CASES}) == sorted(endings())


def _run(tmp_path, how: str, options: list[str], fmt: str) -> tuple[int, str, dict]:
    out = tmp_path / "run"
    args = ["run", "ends_as.py", "--out", str(out), "-f", fmt, "--fail-on", "never"]
    if options != ["<Ctrl-C>"]:
        proc = cli(*args, *options, "--", how, cwd=RUN_FIXTURES)
        code, printed = proc.returncode, proc.stdout_text
    else:  # a real SIGINT to torchdoctor, as the terminal sends it, once the script trains
        env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
        doctor = subprocess.Popen([sys.executable, "-m", "torchdoctor.cli", *args, "--", how], cwd=RUN_FIXTURES,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        deadline = time.monotonic() + 60
        # Step records, not the file's size: the step file is mapped and NUL-padded from its creation, so its size
        # says nothing, and a Ctrl-C sent then lands in the bootstrap's start-up, before the script runs.
        while not _steps_recorded(out / "steps.rank0.jsonl", 3):
            assert time.monotonic() < deadline and doctor.poll() is None, "the script never trained"
            time.sleep(0.1)
        os.kill(doctor.pid, signal.SIGINT)
        printed = doctor.communicate(timeout=60)[0].decode()
        code = doctor.returncode
    assert processes_of(out) == []
    return code, printed, json.loads((out / "report.json").read_text())


def _steps_recorded(path, count: int) -> bool:
    try:
        return path.read_bytes().count(b'{"kind":"step"') >= count
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[f"{c[2]}-{c[0]}" for c in CASES])
def test_each_value_from_a_real_script(tmp_path, validate_report, case):
    how, options, stopped, exit_code, sig = case
    fmt = ("text", "markdown", "json")[CASES.index(case) % 3]
    code, printed, report = _run(tmp_path, how, options, fmt)
    validate_report(report)
    run = report["run"]
    assert run["stopped"] == stopped, (run, printed[-2000:])
    assert (run["exit_code"], run["signal"]) == (exit_code, sig)
    assert code == EXIT[endings()[stopped].exit]
    if fmt == "json":
        assert json.loads(printed) == report
    else:  # text and markdown print the table's phrase
        flat = " ".join(printed.replace("\\", "").split())
        assert f"The script {endings()[stopped].says}:" in flat, flat[-3000:]


def test_the_schema_lists_the_same_values(report_schema):
    assert report_schema["$defs"]["run"]["properties"]["stopped"]["enum"] == list(endings())


def test_docs_list_the_same_values_with_their_meaning():
    text = (ROOT / "docs" / "run.md").read_text()
    section = text[text.index("### How a run ends"):]
    start = section.index("| --- |")
    table = section[start:section.index("\n\n", start)]
    rows = re.findall(r"^\| `(\w+)` \| (.+) \|$", table, re.M)
    assert rows == [(value, e.meaning) for value, e in endings().items()]

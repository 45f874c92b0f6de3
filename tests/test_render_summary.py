"""The one-screen summary every door prints first, and the full report behind --details.

The demo's own line count (a real `torchdoctor demo`) is in tests/test_demo.py, next to its other runs.
"""

from __future__ import annotations

import io
import re

import pytest

from tests.conftest import cli, repeated_lines
from torchdoctor.model import Evidence, FixReport, Location, Report, RunInfo, Symptom
from torchdoctor.render import plain, render
from torchdoctor.render.document import Table
from torchdoctor.render.run_summary import key_numbers

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LEAKY = """\
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
total = 0
for step in range(10):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total += loss
model.eval()
out = model.forward(torch.ones(4))
"""


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def leaky(tmp_path):
    (tmp_path / "train.py").write_text(LEAKY)
    return tmp_path


# -- the doors, for real -----------------------------------------------------------------------------


def test_check_text_is_the_same_bytes_every_time(leaky):
    first = cli("check", "train.py", cwd=leaky)
    second = cli("check", "train.py", cwd=leaky)
    assert first.returncode == second.returncode == 1, first.stderr_text
    assert first.stdout == second.stdout
    assert "memory-growth" in first.stdout_text and not repeated_lines(first.stdout_text)
    details = cli("check", "--details", "train.py", cwd=leaky)
    assert details.stdout == cli("check", "--details", "train.py", cwd=leaky).stdout


def test_ask_text_is_the_same_bytes_every_time():
    text = "CUDA out of memory. Tried to allocate 2.00 GiB; loss goes nan with fp16"
    first, second = cli("ask", text), cli("ask", text)
    assert first.returncode == 0, first.stderr_text
    assert first.stdout == second.stdout
    assert not repeated_lines(first.stdout_text)
    assert cli("ask", "--details", text).stdout == cli("ask", "--details", text).stdout


def test_details_adds_the_fix_reports_after_the_same_summary(leaky):
    summary = cli("check", "train.py", cwd=leaky).stdout_text
    details = cli("check", "--details", "train.py", cwd=leaky).stdout_text
    assert details.startswith(summary.rstrip("\n").rsplit("\nMore\n", 1)[0])  # the summary, then the rest
    for behind in ("Fix 1:", "Route", "  > 11 |     total += loss", "Tensor operations and memory"):
        assert behind not in summary and behind in details, behind
    assert "--details" in summary and "--details" not in details  # no pointer to what is already there


def test_ask_summary_and_details():
    proc = cli("ask", "CUDA out of memory. Tried to allocate 2.00 GiB")
    assert proc.returncode == 0, proc.stderr_text
    row = next(line for line in proc.stdout_text.splitlines() if line.startswith("error "))
    assert row.split()[1] == "oom"
    assert "Fix 1:" not in proc.stdout_text and "`--details` prints the evidence and the fix reports" in proc.stdout_text
    full = cli("ask", "--details", "CUDA out of memory. Tried to allocate 2.00 GiB").stdout_text
    assert "1. Tensor operations and memory" in full and "Fix 1:" in full


def test_json_and_markdown_hold_the_whole_report(leaky, validate_report):
    report = validate_report(cli("check", "--format", "json", "train.py", cwd=leaky).stdout_text)
    assert report["reports"] and all("leads" not in r for r in report["reports"])  # the JSON is unchanged
    assert report["reports"][0]["evidence"]  # kept in the JSON, printed once per symptom in text
    md = cli("check", "--format", "markdown", "train.py", cwd=leaky).stdout_text
    assert "| severity | symptom | where | first fix |" in md
    assert "## Details" in md and "**Fix 1: " in md and "--details" not in md


def test_piped_and_no_color_are_plain_and_force_color_is_rich(leaky):
    piped = cli("check", "train.py", cwd=leaky).stdout_text  # cli() sets NO_COLOR and pipes stdout
    assert not ANSI.search(piped)
    coloured = cli("check", "train.py", cwd=leaky, env={"NO_COLOR": "", "FORCE_COLOR": "1", "COLUMNS": "100"})
    assert ANSI.search(coloured.stdout_text)
    lines = ANSI.sub("", coloured.stdout_text).splitlines()
    rows = [line for line in lines if line.startswith("│") and ("memory-growth" in line or "forward-called" in line)]
    assert len(rows) == 2 and all(len(line) <= 100 for line in lines)  # one line per symptom at 100 columns


# -- the parts, in process ---------------------------------------------------------------------------


def _report() -> Report:
    at = Location("train.py", 11, code="total += loss")
    return Report(
        command="run",
        target="train.py",
        symptoms=[
            Symptom("slow-step", severity="info", title="Slow step"),
            Symptom("memory-growth", severity="error", location=at, step=40, title="Live memory grows",
                    evidence=[Evidence("probe", "grows 9 nodes per step", location=at),
                              Evidence("static", "`total` accumulates `loss` [TD101]", location=at)]),
            Symptom("nonfinite-input", severity="error", step=13, title="The batch itself contains NaN"),
        ],
        reports=[FixReport("memory", "Tensor operations and memory", "Line 11 keeps a graph alive.",
                           symptoms=["memory-growth"], leads={"memory-growth": "Accumulate Python numbers"})],
        run=RunInfo(exit_code=0, steps_completed=40, stopped="completed", duration_s=4.0, measurements={
            "steps": {"steps": 40, "step_time_median_ms": 20.1},
            "memory": {"peak_rss_mib": 313.4, "cuda_peak_mib": 2048.0},
            "gradflow": {"loss_first": 1.3612, "loss_last": "nan"},
            "nan": {"nonfinite_loss_steps": 0},
            "data": {"data_wait_fraction": 0.25},
        }),
        artifacts={"run_dir": "run1", "events": "run1/events.rank0.jsonl", "report": "run1/report.json",
                   "report_html": "run1/report.html"},
    )


def test_summary_ranks_errors_first_and_names_line_step_and_first_fix():
    out = io.StringIO()
    render(_report(), "text", out)
    text = out.getvalue()
    rows = [" ".join(line.split()) for line in text.splitlines() if line.startswith(("error ", "info "))]
    assert rows == [
        "error memory-growth train.py:11 Accumulate Python numbers",  # its specialist's first fix
        "error nonfinite-input step 13 The batch itself contains NaN",  # no fix report: its title
        "info slow-step Slow step",
    ]
    assert "3 symptoms (2 errors, 1 info); start with memory-growth at train.py:11." in text
    assert "Full report, with charts: run1/report.html" in text and "The report as JSON: run1/report.json" in text
    assert "Evidence: run1 (events)" in text
    numbers = "20.1 ms per step (median) · CUDA peak 2048 MiB · loss 1.361 → nan · waiting for data 25.0% of the step"
    assert numbers in " ".join(text.split())  # wrapped at 100 columns


def test_key_numbers_prefer_cuda_and_hide_a_zero_count():
    run = _report().run
    assert key_numbers(run) == ["20.1 ms per step (median)", "CUDA peak 2048 MiB", "loss 1.361 → nan",
                                "waiting for data 25.0% of the step"]
    run.measurements["memory"].pop("cuda_peak_mib")
    run.measurements["nan"]["nonfinite_loss_steps"] = 180
    assert "peak RSS 313 MiB" in key_numbers(run) and "non-finite loss on 180 steps" in key_numbers(run)


def test_the_summary_table_cuts_only_its_last_column():
    table = Table(["a", "b", "c"], [["error", "memory-growth", "x" * 200], ["warning", "oom", "short"]])
    lines = plain.table_lines(table, 100)
    assert lines[0].startswith("error    memory-growth  xxx") and len(lines[0]) == 100 and lines[0].endswith("…")
    assert lines[1] == "warning  oom            short"


def test_rich_rows_stay_one_line_at_100_columns(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    report = _report()
    report.reports[0].leads["memory-growth"] = "Accumulate Python numbers, not graph-holding tensors " * 3
    out = FakeTTY()
    render(report, "text", out)
    lines = ANSI.sub("", out.getvalue()).splitlines()
    row = next(line for line in lines if line.startswith("│") and "memory-growth" in line)
    assert "train.py:11" in row and row.rstrip(" │").endswith("…") and len(row) <= 100
    assert not any(line.strip(" │").startswith("tensors") for line in lines)  # not wrapped onto a second line


def test_repeated_lines_ignores_rules_and_blank_lines():
    assert repeated_lines("a\n----\n\nb\n----\n\n") == []
    assert repeated_lines("a\nb\na\n") == ["a"]


def test_a_big_tree_stays_one_screen():
    """`check` on a tree merges each symptom's findings: the row names the first place and counts the others,
    a long path keeps its end, and past MAX_ROWS symptoms the rest are counted, errors listed first."""
    from torchdoctor.render.summary import MAX_ROWS

    def place(n: int) -> Location:
        return Location(f"src/project/models/very/deep/package/module_{n}.py", 10 + n)

    symptoms = []
    for n in range(MAX_ROWS + 5):
        at = [place(n), place(n + 100), place(n + 200)]
        symptoms.append(Symptom(f"symptom-{n}", severity="error" if n >= 10 else "warning", location=at[0],
                                title=f"Title {n}", evidence=[Evidence("static", "x", location=loc) for loc in at]))
    out = io.StringIO()
    render(Report(command="check", target="src", symptoms=symptoms), "text", out)
    lines = out.getvalue().splitlines()
    rows = [line for line in lines if line.startswith(("error ", "warning "))]
    assert len(rows) == MAX_ROWS and all(len(line) <= 100 for line in lines)
    assert all(row.startswith("error ") for row in rows[:15])  # the 15 errors first
    assert "  …p/package/module_10.py:20 +2  Title 10" in rows[0]  # 26 characters of the place, then the count
    assert "… and 5 symptoms (5 warnings): --details lists every one." in lines
    out = io.StringIO()
    render(Report(command="check", target="src", symptoms=symptoms), "markdown", out)
    assert "| warning | symptom-9 |" in out.getvalue() and "--details" not in out.getvalue()

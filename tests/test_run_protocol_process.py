"""What the protocol probes must not change about the script's process and the run directory: warnings name
the user's line through the probes' wrappers, a reused --out holds nothing of an earlier run, and the
probes' end-of-run work (gradcheck) is no hang — that last one on proto_fn_many.py in test_run_protocol.py."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli
from tests.test_run_protocol import protocol_run
from tests.test_run_support import RUN_FIXTURES
from torchdoctor import exitcodes
from torchdoctor.analysis.evidence import EventTail
from torchdoctor.run_files import MANIFEST, OUR_FILES

pytestmark = pytest.mark.slow

WARNING_LINE = re.compile(r"^(?P<path>\S+?):(?P<line>\d+): (?P<category>\w+Warning): (?P<text>.{0,60})", re.M)
# Files of the user's whose names merely look like ours: they must survive a reused --out.
USERS = ["notes.txt", "trace.json", "lr_curves.csv.bak", "events.jsonl"]


def warnings_of(stderr: str) -> list[tuple[str, int, str, str]]:
    return [(m["path"], int(m["line"]), m["category"], m["text"]) for m in WARNING_LINE.finditer(stderr)]


@pytest.fixture(scope="module")
def reused(tmp_path_factory):
    """proto_warnings.py under every probe, into an --out that holds an earlier run's files (a real
    proto_sched_epoch.py run's, lr_curves.csv and its manifest included, copied with their times) and some
    of the user's whose names merely look alike."""
    earlier = Path(protocol_run(tmp_path_factory, "sched_epoch").run_dir)
    out = tmp_path_factory.mktemp("reused")
    for path in earlier.iterdir():
        shutil.copy2(path, out / path.name)
    for name in USERS:
        (out / name).write_text("x")
    copied = sorted(p.name for p in earlier.iterdir())
    proc = cli("run", "--out", str(out), "--format", "json", "proto_warnings.py", cwd=RUN_FIXTURES)
    return proc, out, copied


def test_a_reused_out_keeps_nothing_of_an_earlier_run(reused):
    proc, out, copied = reused
    assert proc.returncode == exitcodes.OK, proc.stderr_text[-2000:]
    assert "lr_curves.csv" in copied and MANIFEST in copied  # the earlier run drew its curves
    left = sorted(p.name for p in out.iterdir())
    report = json.loads((out / "report.json").read_text())
    assert "scheduler-order" in {s["id"] for s in report["symptoms"]}  # a warning: below --fail-on error
    assert "lr_curves" not in report["artifacts"]
    assert "lr_curves.csv" not in left, left
    assert set(USERS) <= set(left)
    assert all((out / name).read_text() == "x" for name in USERS)
    assert all(OUR_FILES.match(name) for name in set(left) - set(USERS) - {MANIFEST}), left  # nothing else


def test_warnings_name_the_users_line_as_plain_python_does(reused):
    proc, _, _ = reused
    plain = subprocess.run([sys.executable, "proto_warnings.py"], cwd=RUN_FIXTURES, capture_output=True,
                           text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr[-2000:]
    expected = warnings_of(plain.stderr)
    script = str(RUN_FIXTURES / "proto_warnings.py")
    # the schedule, GradScaler, clip_grad_norm_ and autograd.backward wrappers are all on these paths
    assert {line for path, line, _, _ in expected if path == script} >= {11, 17, 18, 19}, plain.stderr
    assert warnings_of(proc.stderr_text) == expected, proc.stderr_text[-3000:]


def test_a_warning_from_c_code_a_wrapper_calls_names_the_callers_line(tmp_path):
    """C code takes the innermost Python frame for its warnings (PyErr_WarnEx(…, 1)): a wrapper's. `_warnings.warn`
    is such C code; the warning must name the line that called the wrapper, printed and recorded alike."""
    script = tmp_path / "c_warning.py"
    script.write_text(
        "import _warnings\n"
        "import warnings\n"
        "from torchdoctor.probes.transparent import transparent\n"
        "\n"
        "\n"
        "def wrapper():\n"
        "    return _warnings.warn('from C code', UserWarning)\n"
        "\n"
        "\n"
        "transparent(wrapper)\n"
        "wrapper()\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    wrapper()\n"
        "print(caught[0].filename, caught[0].lineno)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert warnings_of(proc.stderr) == [(str(script), 11, "UserWarning", "from C code")]
    assert proc.stdout.split() == [str(script), "14"]


def test_every_file_a_run_writes_is_ours_to_replace():
    """The names the probes give rank_file / artifact_path and the analyses' own files all match OUR_FILES."""
    names = set()
    for path in [*(ROOT / "probes").glob("*.py"), *(ROOT / "doctor").glob("*.py"), *(ROOT / "doctor" / "analysis").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            if func is not None and (getattr(func, "attr", None) or getattr(func, "id", None)) in (
                    "file_for", "artifact_path", "rank_file"):
                names |= {f"{a.value.partition('.')[0]}.rank0.{a.value.partition('.')[2]}" for a in node.args
                          if isinstance(a, ast.Constant) and isinstance(a.value, str)}
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and "run_dir" in ast.unparse(node.left):
                names |= {node.right.value} if isinstance(node.right, ast.Constant) else set()
    assert {"events.rank0.jsonl", "crash.rank0.txt", "trace.rank0.json", "memory_snapshot.rank0.pickle",
            "lr_curves.csv", "report.json"} <= names
    assert not [n for n in names if not OUR_FILES.match(n)]


def test_the_hang_clock_stops_while_only_the_probes_finish(tmp_path):
    events = tmp_path / "events.rank0.jsonl"
    tail = EventTail(tmp_path)

    def append(*rows: dict) -> bool:
        with open(events, "a") as fh:
            fh.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
        return tail.poll()

    assert append({"kind": "start", "step": 0, "pid": 1}, {"kind": "step", "step": 1}) is True
    assert not tail.only_finishing()
    assert append({"kind": "finishing", "step": 1, "reason": "completed"}) is False
    assert tail.only_finishing()  # gradcheck and the other probes' last work: no hang clock
    assert append({"kind": "exit", "step": 1, "reason": "completed", "code": 0}) is True  # the clock restarts
    assert not tail.only_finishing()  # a process stuck in interpreter shutdown is still a hang

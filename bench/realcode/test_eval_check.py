"""End-to-end check of eval_check.py on a tiny real git mirror and the real `torchdoctor check`.

    .venv/bin/python -m pytest bench/realcode/test_eval_check.py -p no:xdist -x

The mirror holds two commits of one training script: the first misses zero_grad (a labelled bug),
the second is the fix. The healthy manifest points at the fixed commit plus a file with a finding
we judge, so every part of the report (precision, unjudged, lost verdicts, recall) is exercised.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import derived  # noqa: E402
import eval_check  # noqa: E402

TORCHDOCTOR = eval_check.default_torchdoctor()
pytestmark = pytest.mark.skipif(
    not os.path.exists(TORCHDOCTOR) or shutil.which("git") is None, reason="needs git and torchdoctor"
)

BUGGY = """\
import torch


def train(model, loader, optimizer):
    model.train()
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
"""

FIXED = BUGGY.replace("        loss = torch", "        optimizer.zero_grad()\n        loss = torch")

# Two findings we can predict: a deprecated AMP scaler (TD401) and a whole-module save (TD704).
OTHER = """\
import torch

model = torch.nn.Linear(4, 2)
scaler = torch.cuda.amp.GradScaler()
torch.save(model, "model.pt")
"""


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    out = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, str]:
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    git(work, "init", "-q")
    (work / "src" / "train.py").write_text(BUGGY)
    git(work, "add", ".")
    git(work, "commit", "-qm", "buggy")
    buggy = git(work, "rev-parse", "HEAD")
    (work / "src" / "train.py").write_text(FIXED)
    (work / "src" / "other.py").write_text(OTHER)
    git(work, "add", ".")
    git(work, "commit", "-qm", "fix")
    fixed = git(work, "rev-parse", "HEAD")
    mirror = tmp_path / "mirror"
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(work), str(mirror / "acme+trainer" / "repo")], check=True
    )
    return {"tmp": str(tmp_path), "mirror": str(mirror), "buggy": buggy, "fixed": fixed}


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run(corpus: dict[str, str], capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    tmp = Path(corpus["tmp"])
    args = [
        "--torchdoctor",
        TORCHDOCTOR,
        "--mirror",
        corpus["mirror"],
        "--cache",
        str(tmp / "cache"),
        "--json",
        *extra,
    ]
    assert eval_check.main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_precision_recall_and_unjudged(
    corpus: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = write_jsonl(
        tmp_path / "repos.jsonl",
        [
            {
                "repo": "acme/trainer",
                "commit": corpus["fixed"],
                "paths": ["src"],
                "style": "plain-loop",
                "split": "dev",
            }
        ],
    )
    judged = write_jsonl(
        tmp_path / "judged.jsonl",
        [
            {
                "repo": "acme/trainer",
                "commit": corpus["fixed"],
                "path": "src/other.py",
                "line": 4,
                "code": "TD401",
                "verdict": "true",
                "reason": "deprecated scaler",
            },
            {
                "repo": "acme/trainer",
                "commit": corpus["fixed"],
                "path": "src/other.py",
                "line": 99,
                "code": "TD401",
                "verdict": "false",
                "reason": "a verdict whose finding is gone",
            },
            {
                "repo": "acme/trainer",
                "commit": corpus["fixed"],
                "path": "src/other.py",
                "line": 98,
                "code": "TD401",
                "verdict": "true",
                "reason": "a true finding since merged into the one on line 4",
            },
            {
                "repo": "acme/trainer",
                "commit": corpus["fixed"],
                "path": "src/other.py",
                "line": 97,
                "code": "TD704",
                "verdict": "true",
                "reason": "a true finding no longer reported: lost",
            },
        ],
    )
    (tmp_path / "labels").mkdir()
    write_jsonl(
        tmp_path / "labels" / "bugs_test.jsonl",
        [
            {
                "id": "t-001",
                "repo": "acme/trainer",
                "commit": corpus["buggy"],
                "path": "src/train.py",
                "line": 6,
                "family": "zero-grad-missing",
                "codes": ["TD410"],
                "project": ["src"],
                "split": "dev",
            },
            {
                "id": "t-002",
                "repo": "acme/trainer",
                "commit": corpus["buggy"],
                "path": "src/train.py",
                "line": 30,
                "family": "zero-grad-missing",
                "codes": ["TD410"],
                "split": "dev",
            },
        ],
    )
    report = run(
        corpus, capsys, "--manifest", manifest, "--judged", judged, "--bugs-dir", str(tmp_path / "labels")
    )

    assert report["problems"] == []
    rows = report["healthy"]["rows"]
    assert {(r["path"], r["line"], r["code"]) for r in rows} == {
        ("src/other.py", 4, "TD401"),
        ("src/other.py", 5, "TD704"),
    }
    by_rule = report["healthy"]["by_rule"]
    assert by_rule["TD401"]["true"] == 1 and by_rule["TD401"]["precision"] == 1.0
    assert by_rule["TD704"]["unjudged"] == 1
    gone = {j["line"]: j["moved"] for j in report["healthy"]["judged_not_reported"]}
    assert gone == {99: False, 98: True, 97: False}  # TD401 is still reported true in the file; TD704 only unjudged

    found = {r["id"]: r["found"] for r in report["bugs"]["rows"]}
    assert found == {"t-001": True, "t-002": False}  # line 30 is far from the TD410 finding

    # A true finding judged when it was an error and now reported at warning (a rule calibrated down) is below the
    # floor of --min-severity error: still reported, not lost.
    rows_then = [json.loads(line) for line in Path(judged).read_text().splitlines()]
    for row in rows_then:
        row["severity"] = "error" if row["line"] == 4 else row.get("severity", "warning")
    judged_then = write_jsonl(tmp_path / "judged_then.jsonl", rows_then)
    high = run(corpus, capsys, "--manifest", manifest, "--judged", judged_then, "--no-bugs", "--min-severity", "error")
    assert high["healthy"]["rows"] == []
    assert high["healthy"]["judged_below_floor"] == {"true": 1}
    assert 4 not in {j["line"] for j in high["healthy"]["judged_not_reported"]}
    assert report["bugs"]["by_family"]["zero-grad-missing"]["recall"] == 0.5


def test_missing_mirror_is_reported_and_skipped(
    corpus: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = write_jsonl(
        tmp_path / "repos.jsonl",
        [
            {
                "repo": "nobody/absent",
                "commit": "0" * 40,
                "paths": ["x.py"],
                "style": "plain-loop",
                "split": "dev",
            },
            {
                "repo": "acme/trainer",
                "commit": "1" * 40,
                "paths": ["src"],
                "style": "plain-loop",
                "split": "dev",
            },
        ],
    )
    report = run(corpus, capsys, "--manifest", manifest, "--no-bugs")
    assert report["healthy_projects"] == 0
    assert any("github:nobody/absent" in p for p in report["problems"])
    assert any("acme/trainer" in p and "not in the mirror" in p for p in report["problems"])


def test_heldout_is_left_out_of_dev(
    corpus: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = write_jsonl(
        tmp_path / "repos.jsonl",
        [
            {
                "repo": "acme/trainer",
                "commit": corpus["fixed"],
                "paths": ["src"],
                "style": "plain-loop",
                "split": "heldout",
            }
        ],
    )
    assert run(corpus, capsys, "--manifest", manifest, "--no-bugs")["healthy"]["rows"] == []
    rows = run(corpus, capsys, "--manifest", manifest, "--no-bugs", "--split", "heldout")["healthy"]["rows"]
    assert {r["split"] for r in rows} == {"heldout"}
    assert {r["origin"] for r in rows} == {"heldout"}
    copied = write_jsonl(tmp_path / "derived.jsonl", [
        {"repo": "acme/trainer", "commit": corpus["fixed"], "path": "src/other.py", "share": 0.9, "source": "x:y.py"}
    ])
    report = run(corpus, capsys, "--manifest", manifest, "--no-bugs", "--split", "heldout", "--derived", copied)
    origin = {r["path"]: r["origin"] for r in report["healthy"]["rows"]}
    assert origin["src/other.py"] == "heldout, copied from dev"
    assert report["healthy"]["by_origin"]["heldout, copied from dev"]["findings"] == sum(
        1 for r in report["healthy"]["rows"] if r["path"] == "src/other.py"
    )


def test_derived_finds_a_heldout_file_copied_from_a_dev_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two repositories: the heldout one carries the dev one's loop with one line changed (derived), and a
    file of its own that shares only imports (not derived)."""
    body = "".join(f"    value_{i} = compute_something(batch, step={i})\n" for i in range(20))
    loop = "def train(batch):\n" + body
    own = "".join(f"    other_{i} = unrelated_thing(item, k={i})\n" for i in range(20))
    mirror = tmp_path / "mirror"
    commits = {}
    for repo, files in {
        "acme/dev": {"loop.py": loop},
        "acme/held": {"loop.py": loop.replace("step=3", "step=33"), "own.py": "def go(item):\n" + own},
    }.items():
        work = tmp_path / repo.replace("/", "_")
        work.mkdir()
        git(work, "init", "-q")
        for name, text in files.items():
            (work / name).write_text(text)
        git(work, "add", ".")
        git(work, "commit", "-qm", "c")
        commits[repo] = git(work, "rev-parse", "HEAD")
        subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirror / repo.replace("/", "+") / "repo")],
                       check=True)
    manifest = write_jsonl(tmp_path / "repos.jsonl", [
        {"repo": "acme/dev", "commit": commits["acme/dev"], "paths": ["."], "split": "dev"},
        {"repo": "acme/held", "commit": commits["acme/held"], "paths": ["."], "split": "heldout"},
    ])
    out = tmp_path / "derived.jsonl"
    assert derived.main(["--manifest", manifest, "--mirror", str(mirror), "--write", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["repo"], r["path"], r["source"]) for r in rows] == [("acme/held", "loop.py", "acme/dev:loop.py")]
    assert 0.9 <= rows[0]["share"] < 1.0
    assert "derived from a dev file" in capsys.readouterr().out


def test_bad_label_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bugs_bad.jsonl").write_text("{not json\n")
    with pytest.raises(SystemExit) as exc:
        eval_check.main(["--torchdoctor", TORCHDOCTOR, "--bugs-dir", str(tmp_path), "--no-healthy"])
    assert exc.value.code == 2
    assert "bugs_bad.jsonl:1: not JSON" in capsys.readouterr().err


def test_repo_and_code_filters(
    corpus: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = write_jsonl(
        tmp_path / "repos.jsonl",
        [
            {
                "repo": "acme/trainer",
                "commit": corpus["fixed"],
                "paths": ["src"],
                "style": "plain-loop",
                "split": "dev",
            }
        ],
    )
    rows = run(corpus, capsys, "--manifest", manifest, "--no-bugs", "--code", "td70")["healthy"]["rows"]
    assert {r["code"] for r in rows} == {"TD704"}
    report = run(corpus, capsys, "--manifest", manifest, "--no-bugs", "--repo", "other/")
    assert report["healthy_projects"] == 0 and report["healthy"]["rows"] == []


def test_a_heldout_bug_sharing_a_dev_bugs_source_is_reported_apart() -> None:
    bugs = [
        {"id": "a-1", "split": "dev", "source": "https://github.com/o/r/issues/7"},
        {"id": "a-2", "split": "heldout", "source": "https://github.com/O/R/issues/7#issuecomment-9"},
        {"id": "a-3", "split": "heldout", "source": "https://github.com/o/r/issues/8"},
        {"id": "a-4", "source": "https://github.com/o/r/issues/8"},  # no split: dev, as the eval reads it
    ]
    assert eval_check.shared_sources(bugs) == {"a-2", "a-3"}

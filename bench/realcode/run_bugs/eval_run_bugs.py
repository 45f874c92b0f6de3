"""Run every real-bug script of bugs.jsonl under `torchdoctor run` and score what it measured.

Each bug is a small rewrite of a bug from a public fix report (the script's header names it), marked
`# BUG` on the line a diagnosis should point at. A bug is

  found            an expected symptom id was measured (a probe's or the runner's evidence, not only
                   `check`'s static rule) at a line of the script within +-2 of the `# BUG` line;
  found-elsewhere  an expected symptom was measured, but at another line or at none;
  missed           no expected symptom was measured.

Usage:
  python bench/realcode/run_bugs/eval_run_bugs.py                  # every bug, both splits
  python bench/realcode/run_bugs/eval_run_bugs.py --split dev      # the dev third only
  python bench/realcode/run_bugs/eval_run_bugs.py --only sm_,lz_focal_loss --verbose
  python bench/realcode/run_bugs/eval_run_bugs.py --json > results.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))  # bench/realcode: the label helpers both evals share
from sources import shared_sources  # noqa: E402

LINE_TOLERANCE = 2
MARKER = "# BUG"


def load_bugs(path: Path) -> list[dict[str, Any]]:
    bugs = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if text.strip():
            try:
                bugs.append(json.loads(text))
            except json.JSONDecodeError as error:
                raise SystemExit(f"{path}:{number}: not JSON ({error})") from None
    return bugs


def marker_lines(script: Path) -> list[int]:
    return [n for n, text in enumerate(script.read_text().splitlines(), 1) if text.rstrip().endswith(MARKER)]


def marked_file(bug: dict[str, Any]) -> Path:
    """The file that holds the `# BUG` line: the script, or `bug_file` when the bug sits in a module of a small
    package beside it (a checkpoint helper, a training engine the script imports)."""
    return HERE / bug.get("bug_file", bug["script"])


def torchdoctor_command() -> list[str]:
    # The torchdoctor installed next to this interpreter (the worktree's venv), else the one on PATH.
    beside = Path(sys.executable).with_name("torchdoctor")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("torchdoctor")
    if not found:
        raise SystemExit("torchdoctor is not installed next to this Python nor on PATH")
    return [found]


def run_one(bug: dict[str, Any], out_root: Path, timeout: float) -> dict[str, Any]:
    script = HERE / bug["script"]
    out_dir = out_root / bug["id"]
    command = torchdoctor_command() + [
        "run", "--out", str(out_dir), "--format", "json", "--fail-on", "never",
        "--timeout", str(int(timeout)), *bug.get("args", []), str(script),
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        return {"error": f"torchdoctor did not end within {timeout + 60:.0f} s", "seconds": time.monotonic() - started}
    seconds = time.monotonic() - started
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stderr or "").strip().splitlines()[-3:]
        return {"error": f"no JSON report (exit {done.returncode}): {' | '.join(tail)}", "seconds": seconds}
    return {"report": report, "exit_code": done.returncode, "seconds": seconds}


def measured_lines(symptom: dict[str, Any], script: Path) -> list[int]:
    """Lines of `script` named by the symptom's measured evidence (not by check's static rules)."""
    lines = []
    for evidence in symptom.get("evidence", []):
        if evidence.get("kind") == "static":
            continue
        location = evidence.get("location") or {}
        if location.get("line") and _same_file(location.get("path"), script):
            lines.append(int(location["line"]))
    return lines


def _same_file(path: str | None, script: Path) -> bool:
    if not path:
        return False
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = REPO / candidate
    try:
        return candidate.resolve() == script.resolve()
    except OSError:
        return False


def has_measured_evidence(symptom: dict[str, Any]) -> bool:
    return any(e.get("kind") != "static" for e in symptom.get("evidence", []))


def score(bug: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    script = marked_file(bug)
    row: dict[str, Any] = {"id": bug["id"], "family": bug["family"], "split": bug["split"],
                           "expected": bug["expected"], "line": bug["line"],
                           "seconds": round(result.get("seconds", 0.0), 1)}
    if "error" in result:
        row.update(outcome="missed", error=result["error"], reported=[])
        return row
    report = result["report"]
    symptoms = report.get("symptoms", [])
    row["stopped"] = (report.get("run") or {}).get("stopped")
    row["reported"] = sorted({s["id"] for s in symptoms if has_measured_evidence(s)})
    hits = [s for s in symptoms if s["id"] in bug["expected"] and has_measured_evidence(s)]
    lines = sorted({n for s in hits for n in measured_lines(s, script)})
    row["lines"] = lines
    if not hits:
        row["outcome"] = "missed"
    elif any(abs(n - bug["line"]) <= LINE_TOLERANCE for n in lines):
        row["outcome"] = "found"
    else:
        row["outcome"] = "found-elsewhere"
    return row


def select(bugs: list[dict[str, Any]], split: str, only: str | None) -> list[dict[str, Any]]:
    chosen = [b for b in bugs if split == "all" or b["split"] == split]
    if only:
        wanted = [w.strip() for w in only.split(",") if w.strip()]
        chosen = [b for b in chosen if any(b["id"] == w or b["id"].startswith(w) or b["family"] == w for w in wanted)]
    return chosen


def check_markers(bugs: list[dict[str, Any]]) -> list[str]:
    problems = []
    for bug in bugs:
        script = marked_file(bug)
        if not script.exists():
            problems.append(f"{bug['id']}: {script.relative_to(HERE)} does not exist")
            continue
        lines = marker_lines(script)
        if lines != [bug["line"]]:
            problems.append(f"{bug['id']}: line {bug['line']} in bugs.jsonl, '{MARKER}' markers at {lines}")
    return problems


def totals(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = defaultdict(lambda: {"found": 0, "found-elsewhere": 0, "missed": 0, "bugs": 0})
    for row in rows:
        table[row[key]][row["outcome"]] += 1
        table[row[key]]["bugs"] += 1
    return dict(sorted(table.items()))


def print_text(rows: list[dict[str, Any]], verbose: bool, shared: set[str] = frozenset()) -> None:
    width = max((len(r["id"]) for r in rows), default=10)
    for row in rows:
        where = ",".join(map(str, row.get("lines", []))) or "-"
        text = f"{row['id']:<{width}}  {row['split']:<7}  {row['outcome']:<15}  want {'/'.join(row['expected'])} @ {row['line']}"
        if row["outcome"] != "missed":
            text += f"  got line {where}"
        if verbose or row["outcome"] != "found":
            text += f"  [{', '.join(row.get('reported', [])) or 'no symptoms'}; {row.get('stopped') or row.get('error')}; {row['seconds']} s]"
        print(text)
    for split in ("dev", "heldout"):
        split_rows = [r for r in rows if r["split"] == split]
        if not split_rows:
            continue
        t = totals(split_rows, "split")[split]
        print(f"\n{split}: {t['found']}/{t['bugs']} found ({100 * t['found'] / t['bugs']:.0f}%), "
              f"{t['found-elsewhere']} found elsewhere, {t['missed']} missed")
        blind = [r for r in split_rows if r["id"] not in shared]
        if split == "heldout" and len(blind) < len(split_rows):
            b = totals(blind, "split")[split]
            print(f"heldout without the {len(split_rows) - len(blind)} whose source is also a dev bug's: "
                  f"{b['found']}/{b['bugs']} found ({100 * b['found'] / b['bugs']:.0f}%), "
                  f"{b['found-elsewhere']} found elsewhere, {b['missed']} missed")
        if split == "dev":
            for family, f in totals(split_rows, "family").items():
                print(f"  {family:<28} {f['found']}/{f['bugs']} found, {f['found-elsewhere']} elsewhere, {f['missed']} missed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bugs", type=Path, default=HERE / "bugs.jsonl")
    parser.add_argument("--split", choices=["dev", "heldout", "all"], default="all")
    parser.add_argument("--only", help="comma-separated ids, id prefixes or family names")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every row and the totals")
    parser.add_argument("--timeout", type=float, default=60, help="torchdoctor run --timeout for each script (s)")
    parser.add_argument("--out", type=Path, help="keep each run directory under this folder")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)

    if not args.bugs.exists():
        print(f"error: {args.bugs} does not exist", file=sys.stderr)
        return 2
    bugs = load_bugs(args.bugs)
    problems = check_markers(bugs)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    chosen = select(bugs, args.split, args.only)
    if not chosen:
        print("error: no bug matches --split/--only", file=sys.stderr)
        return 2

    out_root = args.out or Path(tempfile.mkdtemp(prefix="run-bugs-"))
    out_root.mkdir(parents=True, exist_ok=True)
    rows = []
    # Scripts write temporary files and DataLoader workers inherit the environment: keep torch to one thread
    # so that two cores shared by several jobs stay usable.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for bug in chosen:
        row = score(bug, run_one(bug, out_root, args.timeout))
        rows.append(row)
        if not args.json:
            print(f"... {row['id']}: {row['outcome']} ({row['seconds']} s)", file=sys.stderr, flush=True)
    if args.out is None:
        shutil.rmtree(out_root, ignore_errors=True)
    if args.json:
        shared = shared_sources(bugs)
        json.dump({"rows": [{**r, "source_in_dev": r["id"] in shared} for r in rows], "splits": totals(rows, "split"),
                   "families": totals(rows, "family")}, sys.stdout, indent=1)
        print()
    else:
        print_text(rows, args.verbose, shared_sources(bugs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Measure `torchdoctor check` on real code: precision on the healthy corpus, recall on labelled bugs.

    python bench/realcode/eval_check.py [--split dev|heldout|all] [--json] [--torchdoctor PATH]

Inputs (next to this script unless given):
  repos.jsonl    the healthy corpus: repo, commit, paths (checked as one project), style, split
  judged.jsonl   verdicts on findings of the healthy corpus: true | false | debatable
  bugs*.jsonl    labelled real bugs (and any file given with --bugs)
  derived.jsonl  heldout files that are copies of dev files (derived.py): precision is also shown
                 for heldout without them, the part of heldout no tuning has seen

Each repository must already be on this machine as a bare mirror (the `fetch` tool puts it under
/work/.mirror/OWNER+NAME/repo). Each entry is extracted once at its commit into the cache
(`git archive COMMIT PATHS | tar -x`), then checked with
`torchdoctor check --format json --fail-on never PATHS` run from the extracted root, so the
reported paths are the paths in the repository.

Precision counts findings at or above --min-severity (default: warning): true / (true + false);
debatable verdicts are counted apart. Recall: a bug is found when a finding in its file with one of
its codes (or, when codes is empty, of the same specialist: the hundreds digit) lies within +-3
lines of the labelled line. The script is a report: it exits 0 unless its own arguments are wrong.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections import Counter, defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NoReturn

from sources import shared_sources

HERE = os.path.dirname(os.path.abspath(__file__))
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}
LINE_SLACK = 3
CHECK_TIMEOUT_S = 600


@dataclass
class Project:
    """One thing to check: a repository at a commit, some paths in it, and what it is for."""

    kind: str  # "healthy" or "bug"
    repo: str
    commit: str
    paths: list[str]
    split: str
    label: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    project: Project
    findings: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


# -- inputs -----------------------------------------------------------------------------------


def fail(message: str) -> NoReturn:
    """A usage problem: one line on stderr, exit 2."""
    print(f"eval_check: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Every JSON object of a .jsonl file; a malformed line stops the script with its place."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                fail(f"{path}:{n}: not JSON ({exc.msg})")
    return rows


def bug_files(folder: str, extra: Iterable[str]) -> list[str]:
    """bugs.jsonl and bugs_*.jsonl in folder (next to this script by default), then the files given with --bugs."""
    found = sorted(glob.glob(os.path.join(folder, "bugs*.jsonl")))
    for path in extra:
        if not os.path.isfile(path):
            fail(f"--bugs {path}: no such file")
        found.append(path)
    out: list[str] = []
    for path in found:
        if os.path.realpath(path) not in {os.path.realpath(p) for p in out}:
            out.append(path)
    return out


def read_bugs(paths: list[str]) -> list[dict[str, Any]]:
    """Bug labels by id; a later file's label replaces an earlier one with the same id."""
    by_id: dict[str, dict[str, Any]] = {}
    for path in paths:
        for row in read_jsonl(path):
            row["_file"] = os.path.basename(path)
            by_id[str(row.get("id", f"{path}:{len(by_id)}"))] = row
    return list(by_id.values())


def bug_project(bug: dict[str, Any]) -> list[str]:
    """What to check for a bug: its `project`, else the file's folder (the top-level files at the root)."""
    if bug.get("project"):
        return [p.rstrip("/") or "." for p in bug["project"]]
    folder = os.path.dirname(bug["path"])
    return [folder] if folder else ["*.py"]


# -- mirrors and the extraction cache ---------------------------------------------------------


def mirror_dir(mirror_root: str, repo: str) -> str:
    """The git dir of a fetched repository: the bare `repo`, or `repo/.git` when the snapshot came with a work tree."""
    base = os.path.join(mirror_root, repo.replace("/", "+"), "repo")
    nested = os.path.join(base, ".git")
    return nested if os.path.isdir(nested) else base


def git(git_dir: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, check=False)


def has_commit(git_dir: str, commit: str) -> bool:
    return git(git_dir, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def tree_files(git_dir: str, commit: str, path: str) -> list[str]:
    """The .py and .ipynb files at `path` (a file, a folder, or "*.py": the top-level files) in commit."""
    args = ["ls-tree", "--name-only", commit] if path == "*.py" else ["ls-tree", "-r", "--name-only", commit]
    if path not in ("*.py", "."):
        args += ["--", path]
    names = git(git_dir, *args).stdout.decode("utf-8", "replace").split("\n")
    suffixes = (".py",) if path == "*.py" else (".py", ".ipynb")
    return [name for name in names if name.endswith(suffixes)]


def extract(project: Project, mirror_root: str, cache: str) -> tuple[str, list[str]]:
    """The extracted root for project's repo at its commit, and the paths to check in it.

    Only the .py and .ipynb files under the paths are extracted (a mirror may lack the blobs of
    large data files), once per (repo, commit, path): a marker file per path records what is there.
    """
    git_dir = mirror_dir(mirror_root, project.repo)
    root = os.path.join(cache, project.repo.replace("/", "+"), project.commit)
    done_dir = os.path.join(root, ".extracted")
    os.makedirs(done_dir, exist_ok=True)
    paths: list[str] = []
    for path in project.paths:
        marker = os.path.join(done_dir, hashlib.sha1(path.encode()).hexdigest())
        if os.path.exists(marker):
            with open(marker, encoding="utf-8") as fh:
                names = [line for line in fh.read().split("\n") if line]
        else:
            names = tree_files(git_dir, project.commit, path)
            if not names:
                raise RuntimeError(f"no .py files at {path}")
            for start in range(0, len(names), 400):
                chunk = names[start : start + 400]
                result = git(git_dir, "archive", "--format=tar", project.commit, "--", *chunk)
                if result.returncode != 0:
                    msg = result.stderr.decode("utf-8", "replace").strip().splitlines()
                    raise RuntimeError(f"git archive {path}: {msg[-1] if msg else 'failed'}")
                with tarfile.open(fileobj=io.BytesIO(result.stdout)) as tar:
                    tar.extractall(root, filter="data")
            with open(marker, "w", encoding="utf-8") as fh:
                fh.write("\n".join(names) + "\n")
        paths += names if path == "*.py" else [path]
    return root, paths


# -- running check ----------------------------------------------------------------------------


def default_torchdoctor() -> str:
    return os.path.join(os.path.dirname(sys.executable), "torchdoctor")


def run_check(project: Project, exe: str, mirror_root: str, cache: str) -> Outcome:
    try:
        root, paths = extract(project, mirror_root, cache)
    except (RuntimeError, OSError, tarfile.TarError) as exc:
        return Outcome(project, error=f"extract: {exc}")
    cmd = [exe, "check", "--format", "json", "--fail-on", "never", "--jobs", "1", *paths]
    try:
        result = subprocess.run(
            cmd, cwd=root, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return Outcome(project, error=f"check ran past {CHECK_TIMEOUT_S} s")
    except OSError as exc:
        return Outcome(project, error=f"cannot run {exe}: {exc}")
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return Outcome(project, error=f"check exit {result.returncode}: {tail}")
    return Outcome(project, findings=list(report.get("findings") or []))


# -- scoring ----------------------------------------------------------------------------------


Key = tuple[str, str, str, int, str, int]


def finding_key(repo: str, commit: str, f: dict[str, Any]) -> Key:
    """(repo, commit, path, line, code, cell): cell is the notebook cell (1-based, all cells), 0 in a .py file."""
    return (
        repo,
        commit,
        str(f.get("path")),
        int(f.get("line") or 0),
        str(f.get("code")),
        int(f.get("cell") or 0),
    )


def ratio(num: int, den: int) -> float | None:
    return round(num / den, 3) if den else None


def fmt_ratio(value: float | None) -> str:
    return "   -" if value is None else f"{value:.2f}"


def precision_table(rows: list[dict[str, Any]], by: str) -> dict[str, dict[str, Any]]:
    """Counts of true/false/debatable/unjudged per value of `by`, with precision = t / (t + f)."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        table[row[by]][row["verdict"] or "unjudged"] += 1
        table["ALL"][row["verdict"] or "unjudged"] += 1
    out = {}
    for key, c in sorted(table.items(), key=lambda kv: (kv[0] == "ALL", kv[0])):
        out[key] = {
            "findings": sum(c.values()),
            "true": c["true"],
            "false": c["false"],
            "debatable": c["debatable"],
            "unjudged": c["unjudged"],
            "precision": ratio(c["true"], c["true"] + c["false"]),
        }
    return out


def score_healthy(
    outcomes: list[Outcome],
    judged: list[dict[str, Any]],
    min_rank: int,
    codes: tuple[str, ...] = (),
    derived: frozenset[tuple[str, str, str]] = frozenset(),
) -> dict[str, Any]:
    """Rows for the findings at or above min_rank (of the given code prefixes, if any), with their verdicts.
    `derived`: (repo, commit, path) of heldout files copied from dev files; their rows' origin says so."""
    verdicts = {
        finding_key(j["repo"], j["commit"], j): j
        for j in judged
        if j.get("verdict") and str(j.get("code", "")).startswith(codes or ("",))
    }
    rows: list[dict[str, Any]] = []
    seen: set[Key] = set()
    below: set[Key] = set()  # still reported, under the severity floor (a rule calibrated to info, a milder shape)
    for out in outcomes:
        p = out.project
        for f in out.findings:
            if codes and not str(f.get("code", "")).startswith(codes):
                continue
            if SEVERITY_RANK.get(str(f.get("severity")), 0) < min_rank:
                below.add(finding_key(p.repo, p.commit, f))
                continue
            key = finding_key(p.repo, p.commit, f)
            if key in seen:  # two manifest entries sharing a file report it once
                continue
            seen.add(key)
            label = verdicts.get(key, {})
            rows.append(
                {
                    "repo": p.repo,
                    "commit": p.commit,
                    "path": key[2],
                    "line": key[3],
                    "code": key[4],
                    "cell": key[5] or None,
                    "family": key[4][:3] + "xx",
                    "severity": f.get("severity"),
                    "split": p.split,
                    "origin": "heldout, copied from dev" if (p.repo, p.commit, key[2]) in derived else p.split,
                    "style": p.label.get("style", ""),
                    "verdict": label.get("verdict", ""),
                    "reason": label.get("reason", ""),
                    "message": f.get("message", ""),
                }
            )
    checked = {(o.project.repo, o.project.commit) for o in outcomes if not o.error}
    # A true finding merged into another (netG's and netD's saves are one finding now) or moved to the line that
    # causes it is still reported, as a true finding of the same rule in the same file: moved, not lost.
    still = {(r["repo"], r["commit"], r["path"], r["code"]) for r in rows if r["verdict"] == "true"}
    gone = [
        j
        for key, j in verdicts.items()
        if key not in seen
        and key not in below
        and (key[0], key[1]) in checked
        and SEVERITY_RANK.get(j.get("severity", "warning"), 1) >= min_rank
    ]
    return {
        "by_rule": precision_table(rows, "code"),
        "by_family": precision_table(rows, "family"),
        "by_split": precision_table(rows, "split"),
        "by_origin": precision_table(rows, "origin"),
        "by_style": precision_table(rows, "style"),
        "by_repo": precision_table(rows, "repo"),
        "rows": rows,
        "judged_below_floor": Counter(
            j["verdict"] for key, j in verdicts.items()
            if key in below and key not in seen and SEVERITY_RANK.get(j.get("severity", "warning"), 1) >= min_rank
        ),
        "judged_not_reported": [
            {**{k: j.get(k) for k in ("repo", "commit", "path", "line", "cell", "code", "verdict", "reason")},
             "moved": j.get("verdict") == "true" and (j["repo"], j["commit"], j["path"], j["code"]) in still}
            for j in gone
        ],
    }


def bug_found(bug: dict[str, Any], findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    codes = set(bug.get("codes") or [])
    want_line = int(bug["line"])
    best = None
    for f in findings:
        if f.get("path") != bug["path"]:
            continue
        code = str(f.get("code"))
        if codes:
            if code not in codes:
                continue
        elif not bug_specialist_match(bug, code):
            continue
        distance = abs(int(f.get("line") or 0) - want_line)
        if distance <= LINE_SLACK and (best is None or distance < best[0]):
            best = (distance, f)
    return best[1] if best else None


def bug_specialist_match(bug: dict[str, Any], code: str) -> bool:
    """With no codes given, any finding of the same specialist (hundreds digit) as the bug's family."""
    family = str(bug.get("family"))
    if family in FAMILY_CODES:
        return code.startswith(FAMILY_CODES[family])
    digit = FAMILY_SPECIALIST.get(family, "")
    return bool(digit) and code.startswith("TD" + digit)


# Families whose rules sit in more than one specialist's range: the codes that answer them.
FAMILY_CODES = {
    "deprecated-api": ("TD401", "TD607", "TD608"),  # the AMP API (mixed precision), removed and deprecated torch API
    "module-prefix-mismatch": ("TD3", "TD706", "TD708"),  # saving the wrapper's keys (distributed), loading bare keys into it, cutting the prefix unchecked (checkpointing)
}


# The specialist (hundreds digit of TD codes) each bug family belongs to, for labels without codes.
FAMILY_SPECIALIST = {
    "graph-leak": "1",
    "eval-without-no-grad": "1",
    "loss-on-detached": "8",
    "softmax-into-cross-entropy": "2",
    "sampler-set-epoch": "3",
    "save-every-rank": "3",
    "ddp-no-sync-misplaced": "3",
    "module-prefix-mismatch": "3",
    "amp-no-scaler": "4",
    "amp-unscale-twice": "4",
    "clip-before-unscale": "4",
    "fp16-overflow-constant": "4",
    "zero-grad-accumulation": "4",
    "zero-grad-missing": "4",
    "scheduler-order": "4",
    "scheduler-period": "4",
    "dataloader-rebuilt": "5",
    "num-workers-zero": "5",
    "host-sync-per-step": "5",
    "train-not-restored": "6",
    "validation-in-train-mode": "6",
    "modules-in-plain-list": "2",
    "backward-in-validation": "6",
    "log-of-zero": "6",
    "unstable-log-sum-exp": "6",
    "deprecated-api": "4",
    "scaler-not-checkpointed": "7",
    "resume-missing-state": "7",
    "load-without-map-location": "7",
    "autograd-wrong-grad-count": "8",
    "autograd-ignores-grad-output": "8",
    "autograd-legacy-function": "8",
}


def score_bugs(outcomes: list[Outcome], shared: set[str] = frozenset()) -> dict[str, Any]:
    """Recall per split, family, label file and origin (`shared`: heldout ids whose source a dev bug shares)."""
    rows = []
    for out in outcomes:
        bug = out.project.label
        hit = None if out.error else bug_found(bug, out.findings)
        near = sorted(
            {
                f"{f.get('code')}:{f.get('line')}"
                for f in out.findings
                if f.get("path") == bug["path"] and abs(int(f.get("line") or 0) - int(bug["line"])) <= 10
            }
        )
        rows.append(
            {
                "id": bug.get("id"),
                "repo": bug["repo"],
                "path": bug["path"],
                "line": bug["line"],
                "family": bug.get("family", "other"),
                "codes": bug.get("codes") or [],
                "split": out.project.split,
                "origin": "heldout, source in dev" if bug.get("id") in shared else out.project.split,
                "file": bug.get("_file", ""),
                "found": hit is not None,
                "by": f"{hit.get('code')}:{hit.get('line')}" if hit else "",
                "nearby": near,
                "error": out.error,
            }
        )
    out_tables: dict[str, Any] = {"rows": rows}
    for by in ("split", "origin", "family", "file"):
        table: dict[str, Counter[str]] = defaultdict(Counter)
        for row in rows:
            for key in (row[by], "ALL"):
                table[key]["bugs"] += 1
                table[key]["found"] += int(row["found"])
                table[key]["with_codes"] += int(bool(row["codes"]))
                table[key]["found_with_codes"] += int(row["found"] and bool(row["codes"]))
        out_tables[f"by_{by}"] = {
            k: {
                **dict(c),
                "recall": ratio(c["found"], c["bugs"]),
                "recall_with_codes": ratio(c["found_with_codes"], c["with_codes"]),
            }
            for k, c in sorted(table.items(), key=lambda kv: (kv[0] == "ALL", kv[0]))
        }
    return out_tables


# -- output -----------------------------------------------------------------------------------


def print_precision(title: str, table: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}")
    width = max([14, *(len(k) for k in table)])
    print(f"  {'':<{width}} {'n':>5} {'true':>5} {'false':>5} {'debat':>5} {'unjdg':>5}  precision")
    for key, c in table.items():
        print(
            f"  {key:<{width}} {c['findings']:>5} {c['true']:>5} {c['false']:>5} {c['debatable']:>5} "
            f"{c['unjudged']:>5}  {fmt_ratio(c['precision'])}"
        )


def print_recall(title: str, table: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"  {'':<28} {'bugs':>5} {'found':>5}  recall  {'w/codes':>7} {'found':>5}  recall")
    for key, c in table.items():
        print(
            f"  {key:<28} {c['bugs']:>5} {c['found']:>5}  {fmt_ratio(c['recall']):>6}  "
            f"{c['with_codes']:>7} {c['found_with_codes']:>5}  {fmt_ratio(c['recall_with_codes']):>6}"
        )


def print_report(report: dict[str, Any], list_unjudged: bool) -> None:
    h = report["healthy"]
    print(
        f"torchdoctor: {report['torchdoctor']}   split: {report['split']}   min severity: {report['min_severity']}"
    )
    print(f"healthy corpus: {report['healthy_projects']} projects checked, {len(h['rows'])} findings")
    for line in report["problems"]:
        print(f"  ! {line}")
    if not h["rows"] and not report["healthy_projects"]:
        print("  (no healthy project checked: precision skipped)")
    else:
        print_healthy(h, list_unjudged)
    print_bugs(report)


def print_healthy(h: dict[str, Any], list_unjudged: bool) -> None:
    print_precision("precision by split (true / (true + false))", h["by_split"])
    if any(key.startswith("heldout, copied") for key in h.get("by_origin", {})):
        print_precision("precision by origin (heldout files >= 80 % copied from a dev file apart: derived.py)",
                        h["by_origin"])
    print_precision("precision by family", h["by_family"])
    print_precision("precision by rule", h["by_rule"])
    print_precision("precision by style", h["by_style"])
    print_precision("precision by repository", h["by_repo"])
    lowered = h.get("judged_below_floor") or {}
    if lowered:
        print(f"\njudged findings still reported, now below the severity floor: {dict(lowered)}")
    gone = h["judged_not_reported"]
    if gone:
        counts = Counter(j["verdict"] for j in gone)
        print(f"\njudged findings no longer reported: {dict(counts)}")
        for j in gone:
            if j["verdict"] != "true":
                continue
            if j["moved"]:
                print(f"  true, now reported on another line of its file: {j['repo']} {j['path']}:{j['line']} {j['code']}")
            else:
                print(
                    f"  lost true positive: {j['repo']} {j['path']}:{j['line']} {j['code']}  ({j['reason']})"
                )
    unjudged = [r for r in h["rows"] if not r["verdict"]]
    if unjudged:
        print(
            f"\nunjudged findings: {len(unjudged)}"
            + ("" if list_unjudged else " (list them with --list-unjudged)")
        )
        if list_unjudged:
            for r in unjudged:
                cell = f" (cell {r['cell']})" if r["cell"] else ""
                print(
                    f"  [{r['split']}] {r['repo']}@{r['commit'][:10]} {r['path']}:{r['line']}{cell} {r['code']} {r['message']}"
                )


def print_bugs(report: dict[str, Any]) -> None:
    b = report["bugs"]
    if b["rows"]:
        print(f"\nbugs: {len(b['rows'])} labels from {', '.join(report['bug_files'])}")
        print_recall("recall by split", b["by_split"])
        if any(key.startswith("heldout, source") for key in b.get("by_origin", {})):
            print_recall("recall by origin (heldout bugs whose source is also a dev bug's apart)", b["by_origin"])
        print_recall("recall by family", b["by_family"])
        print_recall("recall by label file", b["by_file"])
        missed = [r for r in b["rows"] if not r["found"]]
        if missed:
            print("\nmissed bugs (nearby findings within 10 lines):")
            for r in missed:
                why = f" [{r['error']}]" if r["error"] else ""
                print(
                    f"  {r['id']} {r['family']} {r['repo']} {r['path']}:{r['line']} codes={','.join(r['codes']) or '-'}"
                    f" nearby={','.join(r['nearby']) or '-'}{why}"
                )
    else:
        print("\nbugs: no labels found (bench/realcode/bugs*.jsonl or --bugs FILE)")


# -- main -------------------------------------------------------------------------------------


def wanted_repo(repo: str, patterns: list[str]) -> bool:
    """True when no --repo was given or repo contains one of them (case-insensitive)."""
    return not patterns or any(p.lower() in repo.lower() for p in patterns)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Precision and recall of `torchdoctor check` on real code.")
    ap.add_argument("--split", choices=("dev", "heldout", "all"), default="dev")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--torchdoctor", default=default_torchdoctor(), help="the torchdoctor executable")
    ap.add_argument("--manifest", default=os.path.join(HERE, "repos.jsonl"))
    ap.add_argument("--judged", default=os.path.join(HERE, "judged.jsonl"))
    ap.add_argument("--derived", default=os.path.join(HERE, "derived.jsonl"),
                    help="heldout files copied from dev files (derived.py writes it)")
    ap.add_argument("--bugs", action="append", default=[], help="another bug label file (repeatable)")
    ap.add_argument(
        "--bugs-dir", default=HERE, help="where to look for bugs*.jsonl (default: next to this script)"
    )
    ap.add_argument("--no-bugs", action="store_true", help="skip the recall part")
    ap.add_argument("--no-healthy", action="store_true", help="skip the precision part")
    ap.add_argument("--mirror", default="/work/.mirror", help="where fetched mirrors live (OWNER+NAME/repo)")
    ap.add_argument("--cache", default="/tmp/realcode-cache", help="where commits are extracted")
    ap.add_argument("--min-severity", choices=tuple(SEVERITY_RANK), default="warning")
    ap.add_argument(
        "--repo", action="append", default=[], help="only repositories whose name contains this (repeatable)"
    )
    ap.add_argument(
        "--code", help="precision only for these rule codes or prefixes (comma-separated: TD7,TD507)"
    )
    ap.add_argument("--jobs", type=int, default=2, help="checks run at once (default 2)")
    ap.add_argument("--list-unjudged", action="store_true", help="print every unjudged finding")
    ap.add_argument(
        "--write-unjudged", metavar="FILE", help="write unjudged findings as judged.jsonl rows to label"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not os.path.exists(args.torchdoctor):
        fail(f"no torchdoctor at {args.torchdoctor} (give --torchdoctor PATH)")
    if not os.path.isfile(args.manifest):
        fail(f"no manifest at {args.manifest}")
    want = {"dev", "heldout"} if args.split == "all" else {args.split}
    problems: list[str] = []
    projects: list[Project] = []
    if not args.no_healthy:
        for row in read_jsonl(args.manifest):
            if row.get("split") in want and wanted_repo(row["repo"], args.repo):
                projects.append(
                    Project("healthy", row["repo"], row["commit"], list(row["paths"]), row["split"], row)
                )
    files = [] if args.no_bugs else bug_files(args.bugs_dir, args.bugs)
    for bug in read_bugs(files):
        if bug.get("split", "dev") in want and wanted_repo(bug["repo"], args.repo):
            projects.append(
                Project("bug", bug["repo"], bug["commit"], bug_project(bug), bug.get("split", "dev"), bug)
            )

    missing_repos = sorted({p.repo for p in projects if not os.path.isdir(mirror_dir(args.mirror, p.repo))})
    if missing_repos:
        problems.append("not fetched (skipped): " + " ".join(f"github:{r}" for r in missing_repos))
    runnable = []
    for p in projects:
        git_dir = mirror_dir(args.mirror, p.repo)
        if p.repo in missing_repos:
            continue
        if not has_commit(git_dir, p.commit):
            ready = git(git_dir, "rev-parse", "--git-dir").returncode == 0
            why = f"commit {p.commit[:12]} not in the mirror" if ready else "the mirror is not a git dir yet"
            problems.append(f"{p.repo}: {why} (fetch github:{p.repo} again); skipped")
            continue
        runnable.append(p)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(lambda p: run_check(p, args.torchdoctor, args.mirror, args.cache), runnable))
    for o in outcomes:
        if o.error:
            problems.append(f"{o.project.repo} {' '.join(o.project.paths)[:60]}: {o.error}")

    judged = read_jsonl(args.judged) if os.path.exists(args.judged) else []
    derived = frozenset(
        (r["repo"], r["commit"], r["path"]) for r in (read_jsonl(args.derived) if os.path.exists(args.derived) else [])
    )
    healthy = score_healthy(
        [o for o in outcomes if o.project.kind == "healthy"],
        judged,
        SEVERITY_RANK[args.min_severity],
        tuple(c.strip().upper() for c in args.code.split(",") if c.strip()) if args.code else (),
        derived,
    )
    bugs = score_bugs([o for o in outcomes if o.project.kind == "bug"], shared_sources(read_bugs(files)))
    report = {
        "torchdoctor": args.torchdoctor,
        "split": args.split,
        "min_severity": args.min_severity,
        "healthy_projects": sum(1 for o in outcomes if o.project.kind == "healthy" and not o.error),
        "bug_files": [os.path.basename(f) for f in files],
        "problems": problems,
        "healthy": healthy,
        "bugs": bugs,
    }
    if args.write_unjudged:
        with open(args.write_unjudged, "w", encoding="utf-8") as fh:
            for r in healthy["rows"]:
                if not r["verdict"]:
                    keep = ("repo", "commit", "path", "line", "cell", "code", "severity", "split", "message")
                    fh.write(json.dumps({**{k: r[k] for k in keep}, "verdict": "", "reason": ""}) + "\n")
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_report(report, args.list_unjudged)
    return 0


if __name__ == "__main__":
    sys.exit(main())

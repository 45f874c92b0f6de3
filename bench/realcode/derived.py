"""Which heldout files are copies of dev files: heldout precision on them is not blind.

    python bench/realcode/derived.py [--threshold 0.8] [--write bench/realcode/derived.jsonl]

Rules are tuned on dev repositories only, but public projects copy each other: a heldout
repository may carry another project's training loop or utilities almost line for line
(guided-diffusion from improved-diffusion, Deformable-DETR from DETR). A finding in such a file
was, in effect, seen while tuning. This script compares every heldout `.py` file of the manifest
with every dev `.py` file: the share of the heldout file's lines (stripped, longer than 8
characters, not comments) that also occur in the one dev file sharing most of them. Files at or
above --threshold are written to derived.jsonl (repo, commit, path, share, source), which
eval_check.py reads to report heldout precision with and without them.

Needs the mirrors of the manifest's repositories (the `fetch` tool). Exit 0; 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
MIN_LINE = 9  # shorter lines (`return x`, `else:`) are everywhere and say nothing about copying
MIN_LINES = 10  # a file this small shares its lines with anything
COMMON = 200  # a line found in this many dev files is boilerplate (imports), not evidence of a copy


def mirror(root: str, repo: str) -> str:
    return os.path.join(root, repo.replace("/", "+"), "repo")


def py_blobs(git_dir: str, commit: str, paths: list[str]) -> list[tuple[str, str]]:
    """(blob sha, path) of the entry's .py files at its commit."""
    try:
        out = subprocess.run(["git", "-C", git_dir, "ls-tree", "-r", commit], capture_output=True, text=True,
                             check=True).stdout
    except (subprocess.CalledProcessError, OSError):
        return []
    found = []
    for line in out.splitlines():
        meta, path = line.split("\t", 1)
        if not path.endswith(".py"):
            continue
        if any(p in (".", path) or path.startswith(p.rstrip("/") + "/") for p in paths):
            found.append((meta.split()[2], path))
    return found


def line_sets(git_dir: str, shas: list[str]) -> dict[str, set[str]]:
    """Each blob's distinctive lines, read in one `git cat-file --batch`."""
    proc = subprocess.run(["git", "-C", git_dir, "cat-file", "--batch"], input=("\n".join(shas) + "\n").encode(),
                          capture_output=True)
    data, at, out = proc.stdout, 0, {}
    for sha in shas:
        end = data.index(b"\n", at)
        header = data[at:end].split()
        if len(header) < 3 or header[1] == b"missing":
            out[sha], at = set(), end + 1
            continue
        size = int(header[2])
        body = data[end + 1 : end + 1 + size].decode("utf-8", "replace")
        at = end + 1 + size + 1
        out[sha] = {s for s in (raw.strip() for raw in body.splitlines()) if len(s) >= MIN_LINE and not s.startswith("#")}
    return out


def entry_lines(entry: dict, root: str) -> list[tuple[str, set[str]]]:
    git_dir = mirror(root, entry["repo"])
    if not os.path.isdir(git_dir):
        return []
    blobs = py_blobs(git_dir, entry["commit"], entry["paths"])
    if not blobs:
        return []
    lines = line_sets(git_dir, [sha for sha, _ in blobs])
    return [(path, lines[sha]) for sha, path in blobs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=os.path.join(HERE, "repos.jsonl"))
    ap.add_argument("--mirror", default="/work/.mirror")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--write", metavar="FILE", help="write the derived files as JSON lines (default: print only)")
    args = ap.parse_args(argv)
    if not 0 < args.threshold <= 1:
        print("derived: --threshold must be in (0, 1]", file=sys.stderr)
        return 2
    entries = [json.loads(line) for line in open(args.manifest, encoding="utf-8") if line.strip()]

    index: dict[str, list[str]] = defaultdict(list)  # line -> dev files holding it
    for entry in (e for e in entries if e["split"] == "dev"):
        for path, lines in entry_lines(entry, args.mirror):
            for line in lines:
                index[line].append(f"{entry['repo']}:{path}")

    rows, checked = [], 0
    seen: set[tuple[str, str, str]] = set()
    for entry in (e for e in entries if e["split"] == "heldout"):
        for path, lines in entry_lines(entry, args.mirror):
            key = (entry["repo"], entry["commit"], path)
            if key in seen or len(lines) < MIN_LINES:
                continue
            seen.add(key)
            checked += 1
            shared: Counter[str] = Counter()
            for line in lines:
                holders = index.get(line, ())
                if len(holders) < COMMON:
                    shared.update(set(holders))
            if not shared:
                continue
            source, n = shared.most_common(1)[0]
            share = n / len(lines)
            if share >= args.threshold:
                rows.append({"repo": entry["repo"], "commit": entry["commit"], "path": path,
                             "share": round(share, 2), "source": source})
    by_repo = Counter(r["repo"] for r in rows)
    print(f"heldout .py files compared: {checked}; derived from a dev file (>= {args.threshold:.0%} of its lines): "
          f"{len(rows)} in {len(by_repo)} repositories")
    for repo, n in by_repo.most_common():
        print(f"  {n:4d}  {repo}")
    if args.write:
        with open(args.write, "w", encoding="utf-8") as fh:
            for row in sorted(rows, key=lambda r: (r["repo"], r["path"])):
                fh.write(json.dumps(row, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Validate one bugs_hf row and append it (plus its used_sources.tsv line).

Usage: python bench/realcode/hf_add.py '<row as JSON>'

Checks, so a row cannot be added by hand with a slip in it: the repository hashes to heldout,
`commit` is a parent of `fix_commit`, the labelled line exists at `commit` (it is printed so the
labeller sees it), the source and the repository are not used by another set, and the caps of
this set hold (2 rows per repository, 3 per family, unique ids).
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
LABELS = HERE / "bugs_hf.jsonl"
USED_SOURCES = Path("/work/notes/used_sources.tsv")
MIRRORS = Path("/work/.mirror")
FIELDS = ["id", "repo", "commit", "path", "line", "family", "codes", "source",
          "fix_commit", "project", "reason", "split"]


def is_heldout(repo: str) -> bool:
    return int(hashlib.sha256(("realcode-2:" + repo).encode()).hexdigest(), 16) % 3 == 0


def git_dir(repo: str) -> Path:
    base = MIRRORS / repo.replace("/", "+", 1) / "repo"
    # some mirrors are checkouts with the git directory one level down
    return base / ".git" if (base / ".git").is_dir() else base


def git(repo: str, *args: str) -> str:
    cmd = ["git", "--git-dir", str(git_dir(repo)), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def check_and_append(row: dict) -> None:
    repo = row["repo"]
    assert is_heldout(repo), "repository hashes to dev"
    if row.get("fix_commit"):
        parents = git(repo, "rev-list", "--parents", "-n1", row["fix_commit"]).split()[1:]
        assert row["commit"] in parents, f"commit is not a parent of the fix: {parents}"
    lines = git(repo, "show", f"{row['commit']}:{row['path']}").splitlines()
    print("LINE", row["line"], ":", lines[row["line"] - 1])

    existing = [json.loads(line) for line in LABELS.read_text().splitlines()] if LABELS.exists() else []
    assert row["id"] not in {e["id"] for e in existing}, "duplicate id"
    assert sum(e["repo"] == repo for e in existing) < 2, "repository already has 2 rows"
    assert sum(e["family"] == row["family"] for e in existing) < 3, "family already has 3 rows"

    used = USED_SOURCES.read_text()
    assert row["source"] not in used, "source already used"
    others = [line for line in used.lower().splitlines() if "\tbugs_hf.jsonl\t" not in line]
    name = repo.lower()
    assert not any(f"github.com/{name}/" in line or f"github.com/{name}\t" in line for line in others), \
        "repository used by another set"

    row.setdefault("codes", [])
    row.setdefault("project", ["."])
    row["split"] = "heldout"
    with LABELS.open("a") as out:
        out.write(json.dumps({k: row[k] for k in FIELDS}) + "\n")
    with USED_SOURCES.open("a") as out:
        out.write(f"{row['source']}\tbugs_hf.jsonl\theldout\t{row['id']}\n")
    print("added", row["id"])


if __name__ == "__main__":
    check_and_append(json.loads(sys.argv[1]))

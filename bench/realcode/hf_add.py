"""Validate and append one bugs_hf row (+ used_sources line). Usage: hf_add.py '<json>'"""
import json, sys, subprocess, hashlib, glob
row = json.loads(sys.argv[1])
repo = row["repo"]
assert int(hashlib.sha256(("realcode-2:" + repo).encode()).hexdigest(), 16) % 3 == 0, "not heldout"
gd = f"/work/.mirror/{repo.replace('/', '+', 1)}/repo"
import os
if os.path.isdir(gd + "/.git"): gd += "/.git"
def git(*a): return subprocess.run(["git", "--git-dir", gd, *a], capture_output=True, text=True, check=True).stdout
if row.get("fix_commit"):
    parents = git("rev-list", "--parents", "-n1", row["fix_commit"]).split()[1:]
    assert row["commit"] in parents, f"commit not parent of fix: {parents}"
lines = git("show", f"{row['commit']}:{row['path']}").splitlines()
print("LINE", row["line"], ":", lines[row["line"] - 1])
path = "/work/wt-checkheld15/bench/realcode/bugs_hf.jsonl"
existing = [json.loads(l) for l in open(path)] if glob.glob(path) else []
assert row["id"] not in {e["id"] for e in existing}
assert sum(e["repo"] == repo for e in existing) < 2
assert sum(e["family"] == row["family"] for e in existing) < 3, "family full"
used_tsv = open("/work/notes/used_sources.tsv").read()
assert row["source"] not in used_tsv
other_lines = [l for l in used_tsv.lower().splitlines() if "\tbugs_hf.jsonl\t" not in l]
assert not any(f"github.com/{repo.lower()}/" in l or f"github.com/{repo.lower()}\t" in l for l in other_lines), "repo used elsewhere"
order = ["id","repo","commit","path","line","family","codes","source","fix_commit","project","reason","split"]
row.setdefault("codes", []); row.setdefault("project", ["."]); row["split"] = "heldout"
out = {k: row[k] for k in order}
with open(path, "a") as f: f.write(json.dumps(out) + "\n")
with open("/work/notes/used_sources.tsv", "a") as f: f.write(f"{row['source']}\tbugs_hf.jsonl\theldout\t{row['id']}\n")
print("added", row["id"])

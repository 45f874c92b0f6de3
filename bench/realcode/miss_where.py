"""Where the missed bugs of a split are, counted: what does `check` say about each missed row's labelled file?

    python bench/realcode/miss_where.py heldout   # counts only: no row, path or finding is printed

For each missed row: no finding in the labelled file, only other specialists' findings, or the family's specialist
elsewhere in the file (with the distances). Safe on heldout: it prints counts, never code or ids. Rows whose
repository is not extracted under /tmp/realcode-cache (run eval_check.py first) are skipped.
"""

import collections
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import eval_check as ec  # noqa: E402


def main(split: str) -> None:
    rows = [r for f in sorted(glob.glob(os.path.join(HERE, "bugs_*.jsonl")))
            for r in map(json.loads, filter(str.strip, open(f))) if r.get("split") == split]
    exe = ec.default_torchdoctor()
    counts: collections.Counter[str] = collections.Counter()
    distances = []
    for r in rows:
        if not os.path.isdir(os.path.join("/tmp/realcode-cache", r["repo"].replace("/", "+"), r["commit"])):
            continue
        project = ec.Project("bug", r["repo"], r["commit"], ec.bug_project(r), split, r)
        out = ec.run_check(project, exe, "/work/.mirror", "/tmp/realcode-cache")
        if out.error:
            counts["error"] += 1
            continue
        if ec.bug_found(r, out.findings):
            counts["found"] += 1
            continue
        in_file = [f for f in out.findings if f.get("path") == r["path"]]
        codes = set(r.get("codes") or [])
        same = [f for f in in_file if f["code"] in codes or not codes and ec.bug_specialist_match(r, f["code"])]
        if same:
            counts["missed, same specialist in file"] += 1
            distances.append(min(abs(int(f.get("line") or 0) - int(r["line"])) for f in same))
        elif in_file:
            counts["missed, only other specialists in file"] += 1
        else:
            counts["missed, no finding in file"] += 1
    print(split, dict(counts))
    print("distances of same-specialist findings:", sorted(distances))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dev")

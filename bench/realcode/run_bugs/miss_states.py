"""What `run` measured on the bugs it missed: the probes' own summaries, by family, no code.

    python bench/realcode/run_bugs/eval_run_bugs.py --split heldout --json --out DIR > RESULT.json
    python bench/realcode/run_bugs/miss_states.py RESULT.json DIR

For each row not found on its line, prints its family, outcome, the symptoms reported and the one-line summaries
of the measurements that bear on the family (checkpoint loads and saves for a resume, forward classes for a
validation bug, ...), with no id, path or script text, so it is safe on heldout: it says in which measured state a
diagnosis stayed silent, which a dev script can then reproduce. Stop 33's run14a/b tasks started from its output.
"""

from __future__ import annotations

import collections
import json
import os
import sys

# The measurement sections worth printing for each family (the report's run.measurements keys).
SECTIONS = {
    "resume-empty-optimizer": ("checkpoint",),
    "checkpoint-missing-state": ("checkpoint",),
    "backward-in-validation": ("validation",),
    "train-not-restored": ("validation",),
    "eval-without-no-grad": ("validation",),
    "ddp-ranks-diverge": ("distributed",),
    "log-of-zero": ("nan",),
    "fp16-overflow": ("nan", "amp"),
    "loss-on-detached": ("gradflow",),
    "graph-leak": ("memory",),
    "scheduler-period": ("schedule",),
    "zero-grad-missing": ("accumulation",),
    "zero-grad-in-accumulation": ("accumulation",),
    "dataloader-rebuilt": ("data",),
    "host-sync-per-step": ("profile",),
}


def _summary(value: object) -> str:
    if isinstance(value, dict) and isinstance(value.get("summary"), str):
        return value["summary"]
    return json.dumps(value)[:200]


def main(result_path: str, out_dir: str) -> None:
    rows = json.load(open(result_path))["rows"]
    by_family: dict[str, list[str]] = collections.defaultdict(list)
    for row in rows:
        if row.get("outcome") == "found":
            continue
        report_path = os.path.join(out_dir, row["id"], "report.json")
        try:
            run = json.load(open(report_path))["run"]
        except (OSError, ValueError, KeyError):
            by_family[row["family"]].append(f"{row['outcome']}: no report")
            continue
        measured = run.get("measurements") or {}
        parts = [f"{row['outcome']}; reported {sorted(row.get('reported') or [])}; lines {row.get('lines')}"]
        for section in SECTIONS.get(row["family"], ()):
            parts.append(f"  {section}: {_summary(measured[section]) if section in measured else '(not measured)'}")
        by_family[row["family"]].append("\n".join(parts))
    for family in sorted(by_family):
        print(f"## {family} ({len(by_family[family])})")
        for entry in by_family[family]:
            print(entry)
        print()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

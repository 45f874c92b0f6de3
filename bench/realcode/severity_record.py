"""Each rule's record on the dev corpus, and whether its default severity follows the severity rule.

    python bench/realcode/severity_record.py            # the table; exit 0
    python bench/realcode/severity_record.py --json

The rule (bench/realcode/README.md, "Severity"): a rule gates CI (warning or error by default) only while
its findings on the *dev* repositories, counted over every verdict ever given to them in judged.jsonl
(findings later fixed included, since they show how the rule's claim meets code it was not built from),
are right at least half the time once there are 5 or more true-or-false verdicts. A rule below that
reports at info, where it is shown but does not fail a build. Heldout verdicts never enter this table:
they measure the result.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from collections import Counter, defaultdict

import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = os.path.join(HERE, "..", "..", "rules", "static", "rules")
MIN_VERDICTS = 5
MIN_PRECISION = 0.5


def records(judged: str) -> dict[str, Counter]:
    table: dict[str, Counter] = defaultdict(Counter)
    with open(judged, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("split") == "dev":
                table[row["code"]][row["verdict"]] += 1
    return table


def default_levels() -> dict[str, tuple[str, str]]:
    levels = {}
    for path in sorted(glob.glob(os.path.join(RULES, "*.toml"))):
        with open(path, "rb") as fh:
            for rule in tomllib.load(fh).get("rule", []):
                # the level a finding gets by default: `calibrated` when the record put the rule lower
                levels[rule["code"]] = (rule.get("calibrated") or rule["severity"], rule["name"])
    return levels


def expected_level(designed: str, record: Counter) -> str:
    """Info when the dev record is long enough and more often wrong than right; else the level as designed."""
    decided = record["true"] + record["false"]
    if decided >= MIN_VERDICTS and record["true"] / decided < MIN_PRECISION:
        return "info"
    return designed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judged", default=os.path.join(HERE, "judged.jsonl"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table = records(args.judged)
    rows = []
    for code, (level, name) in sorted(default_levels().items()):
        record = table.get(code, Counter())
        # a rule already at info stays there; one above info must keep its record
        wanted = "info" if level == "info" else expected_level(level, record)
        rows.append({"code": code, "name": name, "severity": level, "true": record["true"], "false": record["false"],
                     "debatable": record["debatable"], "follows_rule": wanted == level})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'code':<6} {'severity':<8} {'true':>5} {'false':>5} {'debat.':>6}  name")
    for r in rows:
        mark = "" if r["follows_rule"] else "   <- record below the severity rule: should be info"
        print(f"{r['code']:<6} {r['severity']:<8} {r['true']:>5} {r['false']:>5} {r['debatable']:>6}  {r['name']}{mark}")
    off = [r["code"] for r in rows if not r["follows_rule"]]
    print(f"\n{len(rows)} rules; {len(off)} off the severity rule{': ' + ', '.join(off) if off else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`torchdoctor ask` on real problem reports: lenient top-1 and the clarifying-question rate.

reports.jsonl holds one report per line, each a paraphrase (our own words, PyTorch's error lines kept
verbatim) of a real report from a GitHub issue or a forum thread, with its address and a hand label:

- `kind`: `error` (quotes an error), `description` (states a symptom), `topic` (asks how to do
  something), or `vague` (states neither: the right answer is one clarifying question).
- `expected`: the specialist a careful triage routes to first; `accept`: others that are also a
  fair first stop (a report that straddles two rows of the routing table).
- `split`: `heldout` when int(sha256(url)) % 3 == 0 — a third chosen by its address (never by
  difficulty); those are never tuned on, only their aggregate figure is read.

Lenient top-1: the first specialist of the route is `expected` or one of `accept`, with no question
asked; for a `vague` report, a question is the right answer. The clarifying rate counts the
questions put to reports that state a symptom, an error or a topic (every kind but `vague`).

    python bench/realcode/ask/eval_ask.py            # figures per split, per source, per kind
    python bench/realcode/ask/eval_ask.py --misses   # also list the dev misses (never heldout)
    python bench/realcode/ask/eval_ask.py --dev --misses  # while tuning: dev figures only
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPORTS = HERE / "reports.jsonl"


def load(path: Path = REPORTS) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def judge(report: dict) -> tuple[bool, bool, str]:
    """(right, asked, what it answered) for one report."""
    from torchdoctor.ask import build_report

    result = build_report(report["text"])
    asked = result.question is not None
    if asked:
        answered = f"question:{result.question.id}"
    else:
        answered = result.route[0].specialist if result.route else "no route"
    if report["kind"] == "vague":
        return asked, asked, answered
    right = not asked and answered in (*report["expected"], *report.get("accept", ()))
    return right, asked, answered


def rate(hits: int, total: int) -> str:
    return f"{hits}/{total} = {hits / total:.1%}" if total else "0/0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--misses", action="store_true", help="list the dev reports routed wrongly")
    parser.add_argument("--dev", action="store_true", help="print the dev split only (while tuning)")
    args = parser.parse_args()

    reports = load()
    by_split: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_source: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    by_kind: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    asked_stated: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    misses = []
    for report in reports:
        right, asked, answered = judge(report)
        split = report["split"]
        for table, key in ((by_split, split), (by_source, (split, report["source"])), (by_kind, (split, report["kind"]))):
            table[key][0] += right
            table[key][1] += 1
        if report["kind"] != "vague":
            asked_stated[split][0] += asked
            asked_stated[split][1] += 1
        if not right and split == "dev":
            misses.append((report, answered))

    sources = {r["where"] for r in reports}
    print(f"{len(reports)} reports from {len(sources)} repositories and sites")
    for split in ("dev",) if args.dev else ("dev", "heldout"):
        print(f"\n{split}: lenient top-1 {rate(*by_split[split])}")
        for (s, source), (hits, total) in sorted(by_source.items()):
            if s == split:
                print(f"  source {source:8} {rate(hits, total)}")
        for (s, kind), (hits, total) in sorted(by_kind.items()):
            if s == split:
                print(f"  kind   {kind:11} {rate(hits, total)}")
        print(f"  clarifying question on reports that state a symptom or topic: {rate(*asked_stated[split])}")
    if not args.dev:
        total_asked = sum(v[0] for v in asked_stated.values())
        total_stated = sum(v[1] for v in asked_stated.values())
        print(f"\nall: clarifying question on reports that state a symptom or topic: {rate(total_asked, total_stated)}")
    if args.misses:
        print(f"\ndev misses ({len(misses)}):")
        for report, answered in misses:
            wanted = "question" if report["kind"] == "vague" else "/".join([*report["expected"], *report.get("accept", ())])
            first = report["text"].strip().splitlines()[0][:110]
            print(f"  {report['id']} [{report['kind']}] want {wanted}, got {answered}: {first}")


if __name__ == "__main__":
    main()

"""How close `torchdoctor fit` (on this CPU) comes to what an H100 measured (bench/fit/data/truth.json).

For every config of configs.toml: the estimated reserved peak at each measured batch size against
`torch.cuda.max_memory_reserved()`, and the largest batch for a 24 GiB card against the one found
on the GPU (a card emulated with the measured CUDA context). Prints a table and the summary the
issue's targets are stated in.

    python bench/fit/eval_fit.py [--only NAME] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from torchdoctor.fit.estimate import FitError, largest_batch, measure  # noqa: E402

CARD = {"name": "24 GiB", "bytes": 24 * 2**30, "major": 9, "minor": 0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    configs = tomllib.loads((HERE / "configs.toml").read_text())["config"]
    truth = {c["name"]: c for c in json.loads((HERE / "data" / "truth.json").read_text())["configs"]}
    context = json.loads((HERE / "data" / "truth.json").read_text())["context_bytes"]
    rows = []
    for config in configs:
        if opts.only and config["name"] not in opts.only:
            continue
        known = truth[config["name"]]
        spec = {"script": str(HERE / "scripts" / config["script"]), "argv": list(config["args"]),
                "card": CARD, "steps": 2, "cwd": str(ROOT)}
        row = {"name": config["name"], "points": []}
        started = time.time()
        try:
            steps = [measure(spec, batch, 900) for batch in config["batches"]]
        except FitError as exc:
            row["error"] = str(exc)
            rows.append(row)
            print(f"{config['name']:20s} ERROR {exc}", flush=True)
            continue
        row["seconds"] = round(time.time() - started, 1)
        for step, real in zip(steps, known["peaks"], strict=True):
            if "max_reserved" not in real:
                continue
            row["points"].append({"batch": step.batch, "estimated": step.peak_reserved, "measured": real["max_reserved"],
                                  "error": step.peak_reserved / real["max_reserved"] - 1,
                                  "breakdown": step.breakdown})
        row["max_batch"] = largest_batch(steps[0], steps[1], CARD["bytes"] - context)
        row["max_batch_measured"] = known["max_batch_24gib"]
        row["heldout"] = bool(config.get("heldout"))
        rows.append(row)
        errs = " ".join(f"b{p['batch']}:{p['estimated'] / 2**30:.2f}/{p['measured'] / 2**30:.2f} GiB "
                        f"({p['error']:+.1%})" for p in row["points"])
        print(f"{config['name']:20s} {errs}  max batch {row['max_batch']} vs {row['max_batch_measured']}  "
              f"[{row['seconds']} s]", flush=True)
    for split in ("tuned", "heldout"):
        part = [p["error"] for r in rows if r.get("heldout", False) == (split == "heldout") for p in r.get("points", [])]
        if part:
            print(f"{split}: {len(part)} peaks; within ±10 %: {sum(abs(e) <= 0.10 for e in part)}; "
                  f"median |error| {statistics.median(abs(e) for e in part):.1%}; "
                  f"more than 5 % too low: {sum(e < -0.05 for e in part)}; worst {max(part, key=abs):+.1%}")
    errors = [p["error"] for r in rows for p in r.get("points", [])]
    batch_ok = [r for r in rows if r.get("max_batch") and r.get("max_batch_measured")
                and abs(r["max_batch"] / r["max_batch_measured"] - 1) <= 0.10]
    batch_all = [r for r in rows if r.get("max_batch_measured")]
    if errors:
        print(f"\npeaks: {len(errors)} points; within ±10 %: {sum(abs(e) <= 0.10 for e in errors)}; "
              f"median |error| {statistics.median(abs(e) for e in errors):.1%}; "
              f"more than 5 % too low: {sum(e < -0.05 for e in errors)}; worst {max(errors, key=abs):+.1%}")
        print(f"largest batch on a 24 GiB card within 10 %: {len(batch_ok)} of {len(batch_all)}")
    if opts.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

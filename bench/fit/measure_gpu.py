"""Measure the truth `fit` is judged against, on a real GPU.

For every config in configs.toml this records, in a fresh process per
measurement:
- `torch.cuda.max_memory_reserved()` and `max_memory_allocated()` after 3
  training steps at each listed batch size;
- the CUDA context's size (NVML's used memory after CUDA init, before any
  tensor), which `max_memory_reserved` does not count;
- the caching allocator's trace (alloc/free/segment events, from
  `_record_memory_history`) at the first batch size, so the allocator replay
  can be tested on CPU against what the real allocator did;
- the largest batch that trains on each emulated card (24 and 16 GiB), found by
  search under `set_per_process_memory_fraction`, each trial a real step.

Usage (on the GPU machine): python bench/fit/measure_gpu.py OUT_DIR [--only NAME]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
CARDS_GIB = (24,)

CHILD = r'''
import gc, json, os, runpy, sys
import torch
mode, script, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
args = json.loads(sys.argv[5])
extra = sys.argv[6:]  # read now: run() replaces sys.argv with the script's own
torch.cuda.init()
free0, total = torch.cuda.mem_get_info()
torch.empty(1, device="cuda"); torch.cuda.synchronize()
free1, _ = torch.cuda.mem_get_info()
result = {"context_bytes": total - free1 - torch.cuda.memory_reserved(), "total_bytes": total,
          "device": torch.cuda.get_device_name(), "torch": torch.__version__}
del_ok = torch.cuda.memory_reserved()

def run(batch):
    sys.argv = [script, "--batch-size", str(batch), "--steps", str(steps)] + args
    runpy.run_path(script, run_name="__main__")

if mode == "peak":
    batch = int(extra[0]); trace = extra[1] == "1"
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    if trace:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    run(batch)
    torch.cuda.synchronize()
    result.update(batch=batch, max_reserved=torch.cuda.max_memory_reserved(),
                  max_allocated=torch.cuda.max_memory_allocated())
    if trace:
        snap = torch.cuda.memory._snapshot()
        events = [[e["action"], e["addr"], e["size"], e.get("stream", 0)] for e in snap["device_traces"][0]]
        result["trace"] = events
    with open(out, "w") as f:
        json.dump(result, f)
elif mode == "trial":
    cap = int(extra[0]) * 2**30
    result["context_bytes"] = int(os.environ.get("FIT_CONTEXT_BYTES", result["context_bytes"]))
    torch.cuda.set_per_process_memory_fraction((cap - result["context_bytes"]) / total)
    try:
        run(int(extra[1]))
        result["fits"] = True
    except torch.OutOfMemoryError:
        result["fits"] = False
    with open(out, "w") as f:
        json.dump(result, f)
else:
    cap = int(extra[0]) * 2**30
    # Other processes share the card during the search, so mem_get_info counts their memory
    # too: the context measured alone (peak mode) is passed in instead.
    result["context_bytes"] = int(os.environ.get("FIT_CONTEXT_BYTES", result["context_bytes"]))
    frac = (cap - result["context_bytes"]) / total
    torch.cuda.set_per_process_memory_fraction(frac)
    def fits(batch):
        ok = True
        try:
            run(batch)
        except torch.OutOfMemoryError:
            ok = False
        gc.collect(); torch.cuda.empty_cache()
        return ok
    lo, hi = 0, int(extra[1])
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > 2**20:
            break
    # To within 1 %: the estimate is judged at 10 %, and each trial is a real step.
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    result.update(card_gib=int(extra[0]), fraction=frac, max_batch=lo)
    with open(out, "w") as f:
        json.dump(result, f)
'''


def child(mode: str, config: dict, out: Path, *extra: str, steps: int = 3) -> dict:
    script = str(HERE / "scripts" / config["script"])
    cmd = [sys.executable, "-c", CHILD, mode, script, str(out), str(steps), json.dumps(config["args"]), *extra]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not out.exists():
        return {"error": proc.stderr[-2000:], "seconds": time.time() - started}
    data = json.loads(out.read_text())
    data["seconds"] = round(time.time() - started, 1)
    return data


def fresh_search(config: dict, out: Path, card: int = 24) -> dict:
    """The largest batch, each trial in a new process (nothing kept from the trial before)."""
    def fits(batch: int) -> bool:
        tmp = out / f"{config['name']}-trial{batch}.json"
        data = child("trial", config, tmp, str(card), str(batch), steps=2)
        tmp.unlink(missing_ok=True)
        return bool(data.get("fits"))

    lo, hi = 0, config["batches"][0]
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return {"name": config["name"], "max_batch": lo, "card_gib": card, "fresh": True}


def search_all(configs: list[dict], out: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(config: dict) -> dict:
        row = {"name": config["name"], "max_batch": {}}
        for card in CARDS_GIB:
            tmp = out / f"{config['name']}-search{card}.json"
            row["max_batch"][str(card)] = child("search", config, tmp, str(card), str(config["batches"][0]), steps=2)
            tmp.unlink(missing_ok=True)
        print(json.dumps(row)[:400], flush=True)
        return row

    # Three processes, each capped at 24 GiB by its memory fraction, fit one 80 GB card together.
    with ThreadPoolExecutor(3) as pool:
        rows = list(pool.map(one, configs))
    (out / "search.json").write_text(json.dumps(rows, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--only", action="append")
    parser.add_argument("--no-search", action="store_true")
    parser.add_argument("--fresh", action="store_true",
                        help="the largest-batch search with a new process per trial")
    parser.add_argument("--search-only", action="store_true",
                        help="only the largest-batch search, 3 configs at a time (each capped to one card's memory)")
    opts = parser.parse_args()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = tomllib.loads((HERE / "configs.toml").read_text())["config"]
    truth, traces = [], {}
    if opts.fresh:
        from concurrent.futures import ThreadPoolExecutor

        chosen = [c for c in configs if not opts.only or c["name"] in opts.only]
        with ThreadPoolExecutor(3) as pool:
            rows = list(pool.map(lambda c: fresh_search(c, out), chosen))
        for row in rows:
            print(json.dumps(row), flush=True)
        (out / "fresh.json").write_text(json.dumps(rows, indent=1))
        return
    if opts.search_only:
        search_all([c for c in configs if not opts.only or c["name"] in opts.only], out)
        return
    for config in configs:
        if opts.only and config["name"] not in opts.only:
            continue
        row = {"name": config["name"], "peaks": [], "max_batch": {}}
        for i, batch in enumerate(config["batches"]):
            tmp = out / f"{config['name']}-{batch}.json"
            data = child("peak", config, tmp, str(batch), "1" if i == 0 else "0")
            tmp.unlink(missing_ok=True)
            if "trace" in data:
                traces[config["name"]] = {"batch": batch, "events": data.pop("trace")}
            row["peaks"].append(data)
        if not opts.no_search:
            for card in CARDS_GIB:
                tmp = out / f"{config['name']}-search{card}.json"
                data = child("search", config, tmp, str(card), str(config["batches"][0]), steps=2)
                tmp.unlink(missing_ok=True)
                row["max_batch"][str(card)] = data
        print(json.dumps({k: v for k, v in row.items()}, default=str)[:600], flush=True)
        truth.append(row)
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    with gzip.open(out / "traces.json.gz", "wt") as f:
        json.dump(traces, f)


if __name__ == "__main__":
    main()

"""The caching-allocator replay against the real allocator, per recorded config.

For each trace in bench/fit/data/allocator_traces.json.gz (recorded on a GPU by
measure_gpu.py), the replay runs over the trace's own allocs and frees and is
compared with what the real allocator did: its peak of reserved bytes (also
checked against truth.json's max_memory_reserved) and its segments.

Columns: `replayed` and `err` use the default address guess (newest segment
lowest); `asc err` the opposite guess; `exact` says whether the replay fed the
recorded segment addresses reproduces the real peak to the byte. A last line
replays the run recorded under a 1 GiB cap (record_allocator_cap.py): the
requests that ran out and the segments given back, against the real ones.

Usage: python bench/fit/eval_allocator.py [--json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

from torchdoctor.fit.allocator import CachingAllocator, replay, trace_events, trace_segments

DATA = Path(__file__).resolve().parent / "data"


def evaluate() -> list[dict]:
    traces = json.loads(gzip.decompress((DATA / "allocator_traces.json.gz").read_bytes()))
    truth = json.loads((DATA / "truth.json").read_text())
    peaks = {c["name"]: {p["batch"]: p for p in c["peaks"] if "batch" in p} for c in truth["configs"]}
    rows = []
    for name, trace in traces.items():
        recorded, segments = trace_segments(trace["events"])
        events = trace_events(trace["events"])
        started = time.perf_counter()
        guessed = replay(events)
        seconds = time.perf_counter() - started
        ascending = replay(events, address_order="ascending")
        exact = replay(events, segment_addresses=[address for address, _ in segments])
        measured = peaks.get(name, {}).get(trace["batch"], {})
        rows.append({
            "config": name,
            "batch": trace["batch"],
            "events": len(events),
            "recorded_peak_reserved": recorded,
            "truth_max_reserved": measured.get("max_reserved"),
            "replayed_peak_reserved": guessed.peak_reserved,
            "error": (guessed.peak_reserved - recorded) / recorded,
            "ascending_error": (ascending.peak_reserved - recorded) / recorded,
            "exact_with_recorded_addresses": exact.peak_reserved == recorded,
            "segments_recorded": len(segments),
            "segments_replayed": guessed.segments,
            "segment_bytes_recorded": sum(size for _, size in segments),
            "segment_bytes_replayed": guessed.segment_bytes,
            "truth_max_allocated": measured.get("max_allocated"),
            "replayed_peak_allocated": guessed.peak_allocated,
            "seconds": seconds,
        })
    return rows


def evaluate_cap() -> dict:
    cap = json.loads(gzip.decompress((DATA / "allocator_cap_trace.json.gz").read_bytes()))
    allocator = CachingAllocator(capacity=cap["allowed_bytes"])
    ooms = wrong = 0
    for index, (action, address, size, _stream) in enumerate(cap["events"]):
        if action == "alloc":
            wrong += not allocator.malloc(address, size)
        elif action == "free_completed":
            if address in allocator.live:
                allocator.free(address)
        elif action == "oom":
            # The real allocator could not find room for this rounded size.
            if allocator.malloc(("oom", index), size):
                wrong += 1
                allocator.free(("oom", index))
            else:
                ooms += 1
    return {
        "allowed_bytes": cap["allowed_bytes"],
        "ooms_recorded": cap["ooms"], "ooms_replayed": ooms, "wrong": wrong,
        "released_recorded": sum(e[0] == "segment_free" for e in cap["events"]),
        "released_replayed": allocator.stats.segments_released,
        "max_reserved": cap["max_reserved"], "replayed_peak_reserved": allocator.stats.peak_reserved,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    opts = parser.parse_args()
    rows, cap = evaluate(), evaluate_cap()
    if opts.json:
        print(json.dumps({"configs": rows, "cap": cap}, indent=1))
        return
    gib = 1 << 30
    print(f"{'config':15} {'batch':>5} {'events':>6} {'recorded':>9} {'truth':>9} {'replayed':>9} {'err':>7} "
          f"{'asc err':>7} {'exact':>5} {'segments':>9} {'ms':>4}")
    for r in rows:
        truth = f"{r['truth_max_reserved'] / gib:9.3f}" if r["truth_max_reserved"] is not None else f"{'-':>9}"
        print(f"{r['config']:15} {r['batch']:5d} {r['events']:6d} {r['recorded_peak_reserved'] / gib:9.3f} {truth} "
              f"{r['replayed_peak_reserved'] / gib:9.3f} {100 * r['error']:+6.2f}% {100 * r['ascending_error']:+6.2f}% "
              f"{'yes' if r['exact_with_recorded_addresses'] else 'no':>5} "
              f"{r['segments_recorded']:4d}/{r['segments_replayed']:<4d} {1000 * r['seconds']:4.0f}")
    errors = sorted(abs(r["error"]) for r in rows)
    within = sum(e <= 0.01 for e in errors)
    print(f"\npeak reserved in GiB; {within} of {len(rows)} within 1 %, median |err| {100 * errors[len(errors) // 2]:.2f} %, "
          f"max |err| {100 * errors[-1]:.2f} %; with the recorded addresses "
          f"{sum(r['exact_with_recorded_addresses'] for r in rows)} of {len(rows)} exact")

    print(f"under a {cap['allowed_bytes'] / gib:.3f} GiB cap: {cap['ooms_replayed']}/{cap['ooms_recorded']} OOMs, "
          f"{cap['released_replayed']}/{cap['released_recorded']} segments given back (replayed/recorded), "
          f"{cap['wrong']} requests judged otherwise, peak reserved {cap['replayed_peak_reserved']} vs "
          f"{cap['max_reserved']} B")


if __name__ == "__main__":
    main()

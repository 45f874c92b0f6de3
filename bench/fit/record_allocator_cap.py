"""Record the caching allocator under a memory cap, on a GPU, for the replay's test.

A fixed pseudo-random sequence of allocations and frees (small, 1-10 MiB and
10-150 MiB requests) runs under set_per_process_memory_fraction(1 GiB / total),
so the allocator repeatedly gives cached segments back to make room and raises
OOM; after each OOM half the live tensors are dropped and the sequence goes on.
The trace (alloc, free, segment and oom entries) and the allocator's own peaks
are written for tests/test_fit_allocator.py.

Usage (on the GPU machine): python bench/fit/record_allocator_cap.py OUT.json.gz
This sequence was recorded 2026-11-25 on an NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, into
bench/fit/data/allocator_cap_trace.json.gz.
"""

from __future__ import annotations

import gzip
import json
import random
import sys

import torch


def main() -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = (1 << 30) / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    rng, live, ooms = random.Random(7), [], 0
    for _ in range(4000):
        if live and rng.random() < 0.45:
            live.pop(rng.randrange(len(live)))
            continue
        k = rng.random()
        if k < 0.5:
            n = rng.randrange(1, 1 << 20)
        elif k < 0.8:
            n = rng.randrange(1 << 20, 10 << 20)
        else:
            n = rng.randrange(10 << 20, 150 << 20)
        try:
            live.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            ooms += 1
            del live[::2]
    snapshot = torch.cuda.memory._snapshot()
    # An oom entry has no addr: it records the device's free bytes instead, and
    # the rounded size it could not get.
    events = [[e["action"], e.get("addr", e.get("device_free", 0)), e["size"], e.get("stream", 0)]
              for e in snapshot["device_traces"][0]]
    out = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "fraction": fraction, "total_bytes": total,
        # setMemoryFraction: allowed = size_t(fraction * total), truncated as in C++.
        "allowed_bytes": int(fraction * total),
        "ooms": ooms, "max_reserved": torch.cuda.max_memory_reserved(),
        "max_allocated": torch.cuda.max_memory_allocated(), "events": events,
    }
    with gzip.open(sys.argv[1], "wt") as f:
        json.dump(out, f)
    print(ooms, len(events), out["max_reserved"], out["allowed_bytes"])


if __name__ == "__main__":
    main()

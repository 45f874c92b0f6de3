"""Distributed runs: how fast a hang is named, and what the probes cost a healthy 2-rank job.

1. Hang to report. tests/fixtures/run/ddp_mismatch.py trains 3 DDP steps, writes
   the time into a file just before rank 0 enters all_reduce and rank 1 enters
   barrier, and both wait for ever. For each round: the seconds from that
   moment to report.json naming both stuck lines (collective-mismatch on rank 0
   at the all_reduce, on rank 1 at the barrier), and to torchdoctor's exit (the
   job stopped, nothing left). Goal: at most --hang-timeout + 5 s.

2. Overhead. A DDP MLP (2 ranks, gloo, one thread each) times its own steps
   after a warm-up and rank 0 writes steps/s, under plain torchrun and under
   `torchdoctor run --nproc-per-node 2` with `--probe none` (the runner, the
   bootstrap and its waiter), `--probe distributed` and the default probes.
   Configurations are interleaved round by round; the median steps/s (wall
   clock, and per CPU-second of rank 0's process, which other load on a
   shared machine disturbs less) and the slowdown against plain (1.00x = no
   cost). Goal: distributed <= 1.10x.

    python bench/bench_distributed.py [--rounds 5] [--hang-timeout 5] [--steps 400]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "run"

LOOP = '''
import json, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

warmup, steps, result = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
for step in range(warmup + steps):
    if step == warmup:
        t0, c0 = time.perf_counter(), time.process_time()
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
if dist.get_rank() == 0:
    with open(result, "w") as fh:
        json.dump({"steps_per_s": steps / wall, "steps_per_cpu_s": steps / cpu}, fh)
dist.destroy_process_group()
'''


def hang_round(hang_timeout: float, work: Path) -> dict:
    stamp, out = work / "hang_began", work / "run"
    for path in (stamp, out / "report.json"):
        path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torchdoctor.cli", "run", "-p", "distributed", "--hang-timeout", str(hang_timeout),
           "--nproc-per-node", "2", "--out", str(out), "-f", "json", "ddp_mismatch.py", "--", "--stamp", str(stamp)]
    proc = subprocess.run(cmd, cwd=FIXTURES, capture_output=True, text=True, timeout=300)
    ended = time.time()
    began = float(stamp.read_text())
    report = json.loads((out / "report.json").read_text())
    found = {s["rank"]: (s["location"] or {}).get("line") for s in report["symptoms"] if s["id"] == "collective-mismatch"}
    return {
        "named": found == {0: 32, 1: 34},
        "to_report_s": (out / "report.json").stat().st_mtime - began,
        "to_exit_s": ended - began,
        "exit": proc.returncode,
    }


def speed_round(name: str, extra: list[str] | None, script: Path, work: Path, warmup: int,
                steps: int) -> dict | None:
    result = work / f"{name}.json"
    result.unlink(missing_ok=True)
    args = [str(script), str(warmup), str(steps), str(result)]
    if extra is None:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    else:
        cmd = [sys.executable, "-m", "torchdoctor.cli", "run", *extra, "--nproc-per-node", "2", "--out",
               str(work / f"run-{name}"), "-f", "json", args[0], "--", *args[1:]]
    subprocess.run(cmd, cwd=work, capture_output=True, timeout=600)
    return json.loads(result.read_text()) if result.exists() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hang-timeout", type=float, default=5.0)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--skip-hang", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    args = parser.parse_args()
    env_note = f"{os.cpu_count()} CPUs, torch via {sys.executable}"
    print(f"bench_distributed: {args.rounds} rounds; {env_note}")

    with tempfile.TemporaryDirectory(prefix="td-bench-dist-") as tmp:
        work = Path(tmp)
        if not args.skip_hang:
            rounds = [hang_round(args.hang_timeout, work) for _ in range(args.rounds)]
            report_s = [r["to_report_s"] for r in rounds]
            exit_s = [r["to_exit_s"] for r in rounds]
            print(f"\nhang -> stuck lines named (--hang-timeout {args.hang_timeout:g} s, goal <= "
                  f"{args.hang_timeout + 5:g} s), {len(rounds)} runs:")
            print(f"  named both ranks' lines: {sum(r['named'] for r in rounds)}/{len(rounds)}; exit codes "
                  f"{sorted({r['exit'] for r in rounds})}")
            print(f"  to report.json:   median {statistics.median(report_s):.2f} s, worst {max(report_s):.2f} s "
                  f"(+{statistics.median(report_s) - args.hang_timeout:.2f} / +{max(report_s) - args.hang_timeout:.2f}"
                  " s over --hang-timeout)")
            print(f"  to torchdoctor's exit: median {statistics.median(exit_s):.2f} s, worst {max(exit_s):.2f} s")

        if not args.skip_speed:
            script = work / "ddp_loop.py"
            script.write_text(LOOP)
            configs: dict[str, list[str] | None] = {
                "plain torchrun": None, "runner only": ["--probe", "none"], "distributed": ["--probe", "distributed"],
                "default probes": [],
            }
            seen: dict[str, list[dict]] = {name: [] for name in configs}
            for _ in range(args.rounds):
                for name, extra in configs.items():
                    value = speed_round(name.replace(" ", "_"), extra, script, work, args.warmup, args.steps)
                    if value is not None:
                        seen[name].append(value)
            base = {k: statistics.median(v[k] for v in seen["plain torchrun"]) for k in ("steps_per_s",
                                                                                       "steps_per_cpu_s")}
            print(f"\nhealthy 2-rank DDP MLP, {args.steps} steps after {args.warmup} (median of {args.rounds}; "
                  "rank 0's wall clock and its CPU time):")
            print(f"  {'configuration':<16} {'steps/s':>9} {'slowdown':>9} {'steps/cpu-s':>12} {'slowdown':>9}")
            for name, values in seen.items():
                if not values:
                    print(f"  {name:<16} {'failed':>9}")
                    continue
                wall = statistics.median(v["steps_per_s"] for v in values)
                cpu = statistics.median(v["steps_per_cpu_s"] for v in values)
                print(f"  {name:<16} {wall:9.1f} {base['steps_per_s'] / wall:8.2f}x {cpu:12.1f} "
                      f"{base['steps_per_cpu_s'] / cpu:8.2f}x")

if __name__ == "__main__":
    main()

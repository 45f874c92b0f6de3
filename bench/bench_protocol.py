"""Overhead of the training-protocol probes (schedule, amp, accumulation, validation, checkpoint, gradcheck,
gradflow) on CPU training loops, as ratios side by side in one run.

The loops of the run benchmark (bench/bench_run.py: a small MLP and a small transformer encoder, AdamW) in
two forms:

- plain      the run benchmark's loop as it is: zero_grad, forward, backward, step;
- protocol   the same loop with everything the probes watch, every step: OneCycleLR stepped per optimizer
             step, bfloat16 autocast, clip_grad_norm_, a custom autograd.Function in the loss, and a
             validation pass (eval(), no_grad(), train()) every 25 steps;

each timed by the script itself over the steps after a warm-up, under:

- python     python script.py
- runner     torchdoctor run --probe none      (the bootstrap and the step hooks alone)
- protocol   torchdoctor run --probe schedule,amp,accumulation,validation,checkpoint,gradcheck,gradflow
- <probe>    each of those probes alone (with --each)

Configurations are interleaved round by round so drift hits them alike; the table shows the median
steps per CPU-second of the script's process and the slowdown against `runner` (the probes' own cost) and
against `python`. Goal: the protocol probes together ≤ 1.05× on both loops. gradcheck runs once, after the
timed steps, and its time (from report.json) is reported on its own.

    python bench/bench_protocol.py [--rounds 5] [--steps 400] [--warmup 60] [--each]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_run import LOOP, MODELS  # noqa: E402 - the run benchmark's loops, shared

PROTOCOL = ("schedule", "amp", "accumulation", "validation", "checkpoint", "gradcheck", "gradflow")

PROTOCOL_LOOP = '''
import json, sys, time
import torch

warmup, steps, result, threads = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
{model}


class Shift(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, by):
        return x + by

    @staticmethod
    def backward(ctx, grad):
        return grad, None


optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=warmup + steps + 1)
t0 = c0 = None
blocks = []  # CPU seconds of each block of 25 steps: a median over them shrugs off a noisy neighbour's burst
for step in range(warmup + steps):
    if step == warmup:
        t0, c0 = time.perf_counter(), time.process_time()
        b0 = c0
    elif step > warmup and (step - warmup) % 25 == 0:
        b = time.process_time()
        blocks.append(b - b0)
        b0 = b
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = Shift.apply(loss_of(model), 0.0)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    if step % 25 == 0:
        model.eval()
        with torch.no_grad():
            loss_of(model)
        model.train()
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
if steps % 25 == 0:
    blocks.append(time.process_time() - b0)
with open(result, "w") as fh:
    json.dump({{"steps_per_s": steps / wall, "steps_per_cpu_s": steps / cpu, "block_cpu_s": blocks}}, fh)
'''


def run_one(script: Path, probes: list[str] | None, warmup: int, steps: int, threads: int, work: Path) -> dict:
    result = work / "result.json"
    result.unlink(missing_ok=True)
    args = [str(warmup), str(steps), str(result), str(threads)]
    if probes is None:
        cmd = [sys.executable, str(script), *args]
    else:
        cmd = [sys.executable, "-m", "torchdoctor.cli", "run", str(script), "--out", str(work / "run"),
               "--format", "json", "--hang-timeout", "0", "--probe", ",".join(probes) or "none", "--", *args]
    env = {**os.environ, "TORCHDOCTOR_RUN_CHECK": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=env)
    if not result.exists():
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    rate = json.loads(result.read_text())
    report = work / "run" / "report.json"
    if probes and report.exists():
        measured = json.loads(report.read_text())["run"]["measurements"]
        rate["gradcheck_s"] = measured.get("gradcheck", {}).get("gradcheck_s")
        rate["us_per_forward"] = measured.get("validation", {}).get("us_per_forward")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--each", action="store_true", help="also each protocol probe alone")
    args = parser.parse_args()
    configs: dict[str, list[str] | None] = {"python": None, "runner": [], "protocol": list(PROTOCOL)}
    if args.each:
        configs.update({name: [name] for name in PROTOCOL})
    results: dict[tuple[str, str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        scripts = {}
        for name, model in MODELS.items():
            for loop, text in (("plain", LOOP), ("protocol", PROTOCOL_LOOP)):
                path = work / f"{name}_{loop}.py"
                path.write_text(textwrap.dedent(text.format(model=model)))
                scripts[(name, loop)] = path
        for r in range(args.rounds):
            for (model, loop), script in scripts.items():
                for config, probes in configs.items():
                    rate = run_one(script, probes, args.warmup, args.steps, args.threads, work)
                    results.setdefault((model, loop, config), []).append(rate)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"protocol probes: median steps per CPU-second over {args.rounds} rounds of {args.steps} steps after "
          f"{args.warmup} warm-up steps; {os.cpu_count()} CPUs, torch threads {args.threads}")
    print(f"{'model':<12} {'loop':<9} {'config':<13} {'steps/cpu-s':>11} {'vs runner':>10} {'vs python':>10} "
          f"{'wall/s':>8}")
    def median(model: str, loop: str, config: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(model, loop, config)])

    for (model, loop) in scripts:
        base, runner = median(model, loop, "python", "steps_per_cpu_s"), median(model, loop, "runner", "steps_per_cpu_s")
        for config in configs:
            cpu = median(model, loop, config, "steps_per_cpu_s")
            print(f"{model:<12} {loop:<9} {config:<13} {cpu:>11.1f} {runner / cpu:>9.3f}× {base / cpu:>9.3f}× "
                  f"{median(model, loop, config, 'steps_per_s'):>8.1f}")
    print("\ngradcheck after the timed steps (protocol loop, one custom Function), and the validation probe's "
          "own account per top-level forward:")
    for model in MODELS:
        runs = results[(model, "protocol", "protocol")]
        grad = [r["gradcheck_s"] for r in runs if r.get("gradcheck_s") is not None]
        fwd = [r["us_per_forward"] for r in runs if r.get("us_per_forward") is not None]
        print(f"{model:<12} gradcheck {statistics.median(grad) * 1e3 if grad else float('nan'):.1f} ms once; "
              f"{statistics.median(fwd) if fwd else float('nan'):.1f} µs per forward")


if __name__ == "__main__":
    main()

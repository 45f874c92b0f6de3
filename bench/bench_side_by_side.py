"""Overhead of `torchdoctor run`, with the plain loop and the probed loop running at the same time.

On a shared machine, runs taken one after another see different neighbours,
clock speeds and cache pressure: the sequential benchmarks (bench_run.py,
bench_protocol.py) read ±5-15% from round to round. Here each round starts the
plain script and the same script under `torchdoctor run` at the same moment,
each pinned to its own core (swapped every round), so whatever slows the
machine slows both; the ratio of the two rates in a round is one sample, and
the table shows the median and the spread of those samples.

The loops are bench_run.py's (an MLP and a transformer encoder, AdamW, one torch
thread) and bench_protocol.py's protocol loop (a OneCycleLR per step, bf16
autocast, clipping, a custom Function, validation every 25 steps).

    python bench/bench_side_by_side.py [--rounds 10] [--steps 400] [--warmup 60]
        [--config default=  --config nan=--probe,nan  --config control=plain  …]
        [--config main@/work/main/.venv/bin/python=  …]   (NAME@PYTHON=…: the probed side under another
                                                          interpreter, e.g. another checkout's venv)

Where glibc's heap lands decides whether a CPU training process takes a page fault per page of its big
temporaries every step: a plain MLP process measured 0.01 to 50 minor faults per step from one start to
the next (an MLP under `torchdoctor run --probe validation`, 303), a lottery that has nothing to do
with torchdoctor. `--heap steady` sets the same fixed malloc thresholds in both processes (no trimming
of the heap, big blocks from the heap, not mmap), so neither draws it; `--heap default` (the default)
leaves glibc's adaptive thresholds, as a user's process has them. In one 16-round run on the shared
machine, steady heaps did not narrow the control's spread: the neighbours' noise dominates.

Linux only (CPU affinity); needs two CPUs.
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
from bench_protocol import PROTOCOL, PROTOCOL_LOOP  # noqa: E402
from bench_run import LOOP, MODELS  # noqa: E402

# "control" runs the plain script on both cores (an A/A test): its spread is the machine's noise floor,
# the band inside which a probed configuration's ratio says nothing.
CONFIGS: dict[str, list[str] | None] = {
    "control": None,
    "default": [],
    "nan": ["--probe", "nan"],
    "protocol": ["--probe", ",".join(PROTOCOL)],
}


# glibc's tunables: with both set, the adaptive mmap threshold is off and the heap is never trimmed
STEADY_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(64 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(256 * 2**20)}


def start(cmd: list[str], cpu: int, work: Path, env: dict[str, str]) -> subprocess.Popen:
    # Every process of the run (the supervisor and the script) stays on its core.
    return subprocess.Popen(["taskset", "-c", str(cpu), *cmd], cwd=work, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)


def side_by_side(script: Path, config: list[str] | None, args: argparse.Namespace, work: Path,
                 swap: bool, python: str = sys.executable) -> tuple[float, float]:
    """plain's steps per CPU-second over the probed run's, both started at once: over the whole window, and
    as the ratio of their median CPU time per block of 25 steps."""
    timing = [str(args.warmup), str(args.steps)]
    plain_out, probed_out = work / "plain.json", work / "probed.json"
    for f in (plain_out, probed_out):
        f.unlink(missing_ok=True)
    plain = [sys.executable, str(script), *timing, str(plain_out), "1"]
    if config is None:  # the control: plain against plain
        probed = [sys.executable, str(script), *timing, str(probed_out), "1"]
    else:
        probed = [python, "-m", "torchdoctor.cli", "run", str(script), "--out", str(work / "run"),
                  "--format", "json", "--hang-timeout", "0", *config, "--", *timing, str(probed_out), "1"]
    env = {**os.environ, **(STEADY_HEAP if args.heap == "steady" else {})}
    procs = [start(plain, 1 if swap else 0, work, env), start(probed, 0 if swap else 1, work, env)]
    for p in procs:
        _, err = p.communicate()
        if p.returncode not in (0, 1):  # 1: torchdoctor found something, which is not our concern here
            raise SystemExit(f"{' '.join(p.args)} failed ({p.returncode}):\n{err[-2000:]}")
    a, b = (json.loads(f.read_text()) for f in (plain_out, probed_out))
    block = statistics.median(b["block_cpu_s"]) / statistics.median(a["block_cpu_s"])
    return a["steps_per_cpu_s"] / b["steps_per_cpu_s"], block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--config", action="append", default=[],
                        help="NAME=ARG,ARG… (torchdoctor run arguments; NAME=plain runs the plain script, an A/A "
                        "control; NAME@PYTHON=… runs torchdoctor with that interpreter, e.g. another checkout's "
                        "venv, against the same plain side); default: control, default, nan, protocol")
    parser.add_argument("--heap", choices=("steady", "default"), default="default",
                        help="steady: the same fixed glibc malloc thresholds in both processes (see above); "
                        "default: glibc's adaptive ones")
    parser.add_argument("--loop", action="append", default=[],
                        help="only these loops (mlp, transformer, mlp+protocol, transformer+protocol)")
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs")
    configs = dict(CONFIGS)
    pythons: dict[str, str] = {}
    if args.config:
        configs = {}
        for item in args.config:
            name, _, rest = item.partition("=")
            name, _, python = name.partition("@")
            if python:
                pythons[name] = python
            configs[name] = None if rest == "plain" else [a for a in rest.split(",") if a]
    loops = {name: LOOP.format(model=model) for name, model in MODELS.items()}
    loops["mlp+protocol"] = PROTOCOL_LOOP.format(model=MODELS["mlp"])
    loops["transformer+protocol"] = PROTOCOL_LOOP.format(model=MODELS["transformer"])
    if args.loop:
        unknown = set(args.loop) - set(loops)
        if unknown:
            raise SystemExit(f"unknown loop(s): {', '.join(sorted(unknown))}; choose from {', '.join(loops)}")
        loops = {name: source for name, source in loops.items() if name in args.loop}
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for r in range(args.rounds):
            for loop, source in loops.items():
                script = work / f"{loop.replace('+', '_')}.py"
                script.write_text(textwrap.dedent(source))
                for name, config in configs.items():
                    if name == "protocol" and "protocol" not in loop:
                        continue  # the protocol probes watch the protocol loop; a plain loop gives them nothing to do
                    python = pythons.get(name, sys.executable)
                    sample = side_by_side(script, config, args, work, r % 2 == 1, python)
                    samples.setdefault((loop, name), []).append(sample)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"side by side: plain and probed started together on their own cores; {args.rounds} rounds of "
          f"{args.steps} steps after {args.warmup}; heap: {args.heap}; slowdown = plain steps/CPU-s over "
          "probed, per round:")
    print("  whole = over the whole window; blocks = median CPU time per 25-step block (probed over plain),")
    print("  which keeps every periodic cost of the probes but not a neighbour's burst on one of the two cores")
    print(f"{'loop':<22} {'config':<10} {'whole':>8} {'min':>8} {'max':>8} {'blocks':>8} {'min':>8} {'max':>8}")
    for (loop, name), values in samples.items():
        whole, blocks = [v[0] for v in values], [v[1] for v in values]
        print(f"{loop:<22} {name:<10} {statistics.median(whole):>7.3f}× {min(whole):>7.3f}× {max(whole):>7.3f}× "
              f"{statistics.median(blocks):>7.3f}× {min(blocks):>7.3f}× {max(blocks):>7.3f}×")

if __name__ == "__main__":
    main()

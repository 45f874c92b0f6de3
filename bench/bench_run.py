"""Overhead of `torchdoctor run` on CPU training loops, as ratios side by side in one run.

Two loops — a small MLP and a small transformer encoder — each timed by the
script itself over the steps after a warm-up (past the memory probe's dense
sampling phase), under:

- plain        python script.py
- runner       torchdoctor run --probe none   (the bootstrap, step hooks and supervision alone)
- default      torchdoctor run                (all default probes)
- <probe>      torchdoctor run --probe <probe>, for each probe alone

Then the nan probe next to autograd's anomaly mode: anomaly mode's cost per step
on the same loops, and both localising one NaN (forward, and backward-only)
after 200 healthy steps: which line each names, and at what cost.

Configurations are interleaved round by round so drift hits them alike; the
table shows the median steps/s and the slowdown against plain (1.00× = no
cost). Goal: memory alone ≤ 1.10×.

    python bench/bench_run.py [--rounds 3] [--steps 300] [--warmup 60] [--only runner,default,nan] [--no-nan]
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

LOOP = '''
import json, sys, time
import torch

warmup, steps, result, threads = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
{model}
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
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
    loss = loss_of(model)
    loss.backward()
    optimizer.step()
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
if steps % 25 == 0:
    blocks.append(time.process_time() - b0)
with open(result, "w") as fh:
    json.dump({{"steps_per_s": steps / wall, "steps_per_cpu_s": steps / cpu, "block_cpu_s": blocks}}, fh)
'''

MODELS = {
    "mlp": """
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 10))
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
def loss_of(model):
    return torch.nn.functional.cross_entropy(model(x), y)
""",
    "transformer": """
layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=2), torch.nn.Linear(64, 1))
x, y = torch.randn(8, 32, 64), torch.randn(8, 32, 1)
def loss_of(model):
    return torch.nn.functional.mse_loss(model(x), y)
""",
}


def configs() -> dict[str, list[str] | None]:
    from torchdoctor.probes import names

    out: dict[str, list[str] | None] = {"plain": None, "runner": ["--probe", "none"], "default": []}
    for name in names():
        out[name] = ["--probe", name]
    # The training-protocol probes together (issue 6; bench/bench_protocol.py has their own loops).
    out["protocol"] = ["--probe", "schedule,amp,accumulation,validation,checkpoint,gradcheck,gradflow"]
    return out


def run_one(script: Path, config: list[str] | None, warmup: int, steps: int, threads: int, work: Path) -> dict:
    result = work / "result.json"
    result.unlink(missing_ok=True)
    args = [str(warmup), str(steps), str(result), str(threads)]
    if config is None:
        cmd = [sys.executable, str(script), *args]
    else:
        cmd = [sys.executable, "-m", "torchdoctor.cli", "run", str(script), "--out", str(work / "run"),
               "--format", "json", "--hang-timeout", "0", *config, "--", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    if not result.exists():
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(result.read_text())


def probe_costs(work: Path) -> dict:
    """The memory probe's own account of its time in the last run (report.json measurements)."""
    report = work / "run" / "report.json"
    if not report.exists():
        return {}
    memory = json.loads(report.read_text())["run"]["measurements"].get("memory", {})
    keys = ("probe_us_per_step", "probe_us_per_step_median", "scans", "scan_ms_total", "censuses", "census_ms_total")
    return {k: memory[k] for k in keys if k in memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=60, help="steps before timing (the dense phase is 40)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads; 1 leaves a core to the supervisor on a 2-core machine, "
                        "where OpenMP's spinning threads otherwise make every timing noise")
    parser.add_argument("--no-nan", dest="nan", action="store_false",
                        help="skip the anomaly-mode comparison of the nan probe")
    parser.add_argument("--only", default="",
                        help="comma-separated configurations to run (plain is always run), e.g. runner,default,nan")
    args = parser.parse_args()
    table = configs()
    if args.only:
        wanted = {"plain", *args.only.split(",")}
        unknown = wanted - set(table)
        if unknown:
            parser.error(f"unknown configuration(s): {', '.join(sorted(unknown))}; known: {', '.join(table)}")
        table = {name: extra for name, extra in table.items() if name in wanted}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        scripts = {}
        for name, model in MODELS.items():
            scripts[name] = work / f"{name}.py"
            scripts[name].write_text(textwrap.dedent(LOOP.format(model=model)))
        results: dict[tuple[str, str], list[dict]] = {}
        costs: dict[str, list[dict]] = {}
        for r in range(args.rounds):
            for model, script in scripts.items():
                for config, extra in table.items():
                    rate = run_one(script, extra, args.warmup, args.steps, args.threads, work)
                    results.setdefault((model, config), []).append(rate)
                    if config == "memory":
                        costs.setdefault(model, []).append(probe_costs(work))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"torchdoctor run overhead: median steps/s over {args.rounds} rounds of {args.steps} steps "
          f"after {args.warmup} warm-up steps; {os.cpu_count()} CPUs, torch threads {args.threads}")
    print("cpu: steps per CPU-second of the script's process (probes run in it; immune to other processes "
          "taking the CPU);\nwall: steps per second, median and best round (noise only ever slows a run down)")
    print("paired: the median over rounds of plain's cpu/s over the configuration's in the same round "
          "(drift between rounds cancels)")
    print(f"{'loop':<12} {'config':<10} {'cpu/s':>8} {'slowdown':>9} {'paired':>8} {'wall/s':>8} {'slowdown':>9} "
          f"{'best/s':>8} {'slowdown':>9}")

    def stat(model: str, config: str, key: str, how) -> float:
        return how(r[key] for r in results[(model, config)])

    for model in scripts:
        base = {k: stat(model, "plain", k, f) for k, f in
                (("steps_per_cpu_s", statistics.median), ("steps_per_s", statistics.median))}
        best_plain = stat(model, "plain", "steps_per_s", max)
        for config in table:
            cpu = stat(model, config, "steps_per_cpu_s", statistics.median)
            wall = stat(model, config, "steps_per_s", statistics.median)
            best = stat(model, config, "steps_per_s", max)
            paired = statistics.median(
                p["steps_per_cpu_s"] / c["steps_per_cpu_s"]
                for p, c in zip(results[(model, "plain")], results[(model, config)], strict=True)
            )
            print(f"{model:<12} {config:<10} {cpu:>8.1f} {base['steps_per_cpu_s'] / cpu:>8.3f}× {paired:>7.3f}× "
                  f"{wall:>8.1f} {base['steps_per_s'] / wall:>8.3f}× {best:>8.1f} {best_plain / best:>8.3f}×")
    total = args.warmup + args.steps
    print(f"\nmemory probe, its own account over all {total} steps (median of the rounds):")
    for model, runs in costs.items():
        med = {k: statistics.median(r[k] for r in runs if k in r) for k in runs[0]}
        print(f"{model:<12} {med.get('probe_us_per_step_median', 0):.1f} µs per step (median; mean "
              f"{med.get('probe_us_per_step', 0):.1f}); "
              f"{med.get('scans', 0):.0f} holder scans, {med.get('scan_ms_total', 0):.1f} ms; "
              f"{med.get('censuses', 0):.0f} censuses, {med.get('census_ms_total', 0):.0f} ms")
    if args.nan:
        nan_section(args.rounds, args.threads)


# -- the nan probe next to autograd's anomaly mode --------------------------------------------------

ANOMALY_ON = "import torch; torch.autograd.set_detect_anomaly(True)\n"  # same line numbers as the original

# Each case trains `warmup` healthy steps, then feeds a batch that makes the first non-finite value in a
# known module and line (marked `# BAD`) and trains on: the log of a zero (-inf, which the next ReLU
# clamps: only its gradient, 1/0, goes non-finite) and the derivative of a hand-written norm at an
# all-zero row (sqrt'(0) = inf, inf × 0 = NaN). Anomaly mode stops at the first NaN in backward.
NAN_CASE = '''
import sys, time
import torch

warmup, threads = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
torch.manual_seed(0)


class Features(torch.nn.Module):
    def forward(self, x):
        {body}


model = torch.nn.Sequential(torch.nn.Linear(256, 512), Features(), torch.nn.ReLU(), torch.nn.Linear({width}, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
y = torch.randint(0, 10, (64,))
for step in range(warmup + 5):  # the bad batch, then training goes on as it would
    x = torch.randn(64, 256)
    if step == warmup:
        {trigger}
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
'''

NAN_CASES = {
    "log of a zero": {
        "body": "return torch.log(x.abs())  # BAD",
        "width": 512,
        "trigger": "x[0] = 0.0; model[0].bias.data[:] = 0.0  # an all-zero hidden row",
    },
    "norm of a zero row": {
        "body": "return torch.cat([x, torch.sqrt((x * x).sum(1, keepdim=True))], 1)  # BAD",
        "width": 513,
        "trigger": "x[0] = 0.0; model[0].bias.data[:] = 0.0  # an all-zero hidden row",
    },
}


def _anomaly_line(stderr: str, script: Path) -> tuple[str | None, int | None]:
    """Anomaly mode's backward function and the script line of the forward call it blames."""
    import re

    fn = re.search(r"Function '(\w+)' returned nan", stderr)
    forward = stderr.split("Traceback of forward call", 1)[-1].split("(Triggered internally", 1)[0]
    lines = [int(m) for m in re.findall(rf'File "{re.escape(str(script))}", line (\d+)', forward)]
    return (fn.group(1) if fn else None), (lines[-1] if lines else None)


def nan_section(rounds: int, threads: int) -> None:
    """Steps/s under anomaly mode vs plain, and localising one NaN: anomaly mode vs the nan probe."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, model in MODELS.items():
            (work / f"{name}.py").write_text(textwrap.dedent(LOOP.format(model=model)))
        _anomaly_loops(rounds, threads, work)
        _localise(threads, work)


def _anomaly_loops(rounds: int, threads: int, work: Path) -> None:
    print("\nautograd anomaly mode on the same loops (what `torch.autograd.set_detect_anomaly(True)` costs "
          "every step):")
    for name in MODELS:
        plain = work / f"{name}.py"
        anomalous = work / f"{name}_anomaly.py"
        anomalous.write_text(plain.read_text().replace("import torch\n", ANOMALY_ON, 1))
        rates = {"plain": [], "anomaly": []}
        for _ in range(rounds):
            for label, script in (("plain", plain), ("anomaly", anomalous)):
                rates[label].append(run_one(script, None, 20, 100, threads, work)["steps_per_s"])
        p, a = statistics.median(rates["plain"]), statistics.median(rates["anomaly"])
        print(f"{name:<12} plain {p:8.1f}/s   anomaly mode {a:8.1f}/s   slowdown {p / a:6.2f}×")


def _localise(threads: int, work: Path) -> None:
    import time

    warmup = 200
    print(f"\nlocalising the first non-finite value after {warmup} healthy steps (MLP 256-512-…-10, batch 64):")
    print("wall s: the whole run (start-up, 200 steps, the failing one and 4 more); line: the script line each "
          "tool blames")
    print(f"{'case':<30} {'tool':<14} {'wall s':>7} {'finds':<44} {'line':>5}")
    for case, parts in NAN_CASES.items():
        script = work / "nan_case.py"
        script.write_text(NAN_CASE.format(**parts))
        bad_line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "# BAD" in text)
        anomalous = work / "nan_case_anomaly.py"
        anomalous.write_text(script.read_text().replace("import torch\n", ANOMALY_ON, 1))
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, str(anomalous), str(warmup), str(threads)], capture_output=True,
                              text=True, cwd=work)
        anomaly_s = time.perf_counter() - started
        fn, line = _anomaly_line(proc.stderr, anomalous)
        print(f"{case:<30} {'anomaly mode':<14} {anomaly_s:7.2f} {str(fn or 'nothing (no NaN in backward)'):<44} "
              f"{str(line):>5}")
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "torchdoctor.cli", "run", str(script), "--out", str(work / "nanrun"),
                        "--format", "json", "--probe", "nan", "--hang-timeout", "0", "--", str(warmup), str(threads)],
                       capture_output=True, text=True, cwd=work)
        ours_s = time.perf_counter() - started
        report = json.loads((work / "nanrun" / "report.json").read_text())
        found = next((s for s in report["symptoms"] if s["id"] in ("nan-loss", "nonfinite-grad")), None)
        values = found["evidence"][0]["values"] if found else {}
        where = (found or {}).get("location") or {}
        what = f"{values.get('first_bad_module')} ({values.get('op')}) in {values.get('localisation_ms')} ms"
        same = "same line as anomaly mode" if where.get("line") == line else "a different line"
        print(f"{'':<30} {'nan probe':<14} {ours_s:7.2f} {what:<44} {str(where.get('line')):>5}  ({same})")
        started = time.perf_counter()
        subprocess.run([sys.executable, str(script), str(warmup), str(threads)], capture_output=True, cwd=work)
        print(f"{'':<30} {'plain python':<14} {time.perf_counter() - started:7.2f} {'(the NaN goes unnoticed)':<44} "
              f"{bad_line:>5}")


if __name__ == "__main__":
    main()

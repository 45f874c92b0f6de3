"""Where `torchdoctor run`'s per-step time goes, probe by probe, measured inside one process.

The side-by-side benchmark (bench_side_by_side.py) gives the overhead that matters, but on a loaded
machine its ratios wander by several percent. This one reads the probes' own cost instead, on the loops of
bench_run.py (an MLP and a transformer encoder, AdamW, one torch thread), in two ways:

profile (cProfile, switched on for the steps after the warm-up, timed by the thread's CPU clock: time spent
waiting for a core is not counted; the median over blocks of steps). The loop runs once plain and once
under `torchdoctor run`; from the probed run's profile, per torchdoctor module (and function):

- calls/step: Python calls of its functions per step (hooks, wrappers, and what they call of ours): a
  count, the same from run to run where the probes' sampling does not follow the measured step time;
- µs/step: CPU time in its frames plus the library and builtin calls they make (a wrapper's call of the
  function it wraps, the user's own work, is left out; ours called back from a library call is charged to
  its own module), less the profiler's own cost per call (measured in the same process);
- torchdoctor frames: the sum; probed / plain: the whole step of the two runs (taken apart in time, so on a
  loaded machine this ratio is noise; it also holds what no frame of ours pays for, such as the slower call
  path of a module with hooks).

  The profiler still inflates call-heavy code, so the µs are larger than without it; between two versions
  of the code on the same machine they compare well, which is what they are for.

toggle (no profiler): after the warm-up, cycles of short blocks of steps, one block per configuration in a
shuffled order: every probe on, every probe off, or one probe off (switched off as the session does after
a probe's error; its hooks stay installed). A probe's cost is the median over cycles of (all on) - (it
off), with about its uncertainty: real µs, but on a loaded machine the uncertainty can exceed them.

    python bench/bench_probe_cost.py [--mode both|profile|toggle] [--loop mlp --loop transformer]
        [--steps 300] [--warmup 60] [--functions 25] [--cycles 12] [--probe nan,memory] [--json out.json]
    <another checkout>/.venv/bin/python bench/bench_probe_cost.py …   (that checkout's torchdoctor)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_run import LOOP, MODELS  # noqa: E402 - the run benchmark's loops, shared

# Runs the loop script under cProfile from the step after `warmup` to step `warmup + steps`, counting the
# steps with torch's global optimizer hook (registered after torchdoctor's, so the window is whole steps).
DRIVER = '''
import cProfile, json, os, runpy, sys, time
warmup, steps, block, out, loop = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

clock = time.thread_time_ns  # CPU time of this thread: time spent waiting for a core is not counted
profile = None
seen = 0


def nothing():
    pass


def event_cost(n=20000):
    """What the profiler adds to one call of a trivial function, in seconds: the least of five tries."""
    best = None
    for _ in range(5):
        a = clock()
        for _ in range(n):
            nothing()
        b = clock()
        p = cProfile.Profile(clock, 1e-9)
        p.enable()
        for _ in range(n):
            nothing()
        p.disable()
        c = clock()
        cost = ((c - b) - (b - a)) / n * 1e-9
        best = cost if best is None else min(best, cost)
    return best


def window(optimizer, args, kwargs):
    global seen, profile
    seen += 1
    if seen <= warmup or (seen - warmup) % block == 0:
        if profile is not None:
            profile.disable()
            profile.dump_stats(f"{out}.{(seen - warmup) // block}")
            profile = None
        if seen == warmup + steps:
            ours = sys.modules.get("torchdoctor")
            dirs, wrappers = [], []
            if ours is not None:
                from torchdoctor import probes
                from torchdoctor.probes import transparent
                dirs = [os.path.dirname(ours.__file__), os.path.dirname(probes.__file__)]
                wrappers = [[c.co_filename, c.co_firstlineno, c.co_name] for c in transparent._HIDDEN]
            with open(out + ".json", "w") as fh:
                json.dump({"blocks": steps // block, "ours": dirs, "wrappers": wrappers, "event_s": event_cost()},
                          fh)
        elif seen >= warmup:
            profile = cProfile.Profile(clock, 1e-9)
            profile.enable()


register_optimizer_step_post_hook(window)
sys.argv = [loop, str(warmup), str(steps), out + ".result", "1"]
runpy.run_path(loop, run_name="__main__")
'''


# Measures each probe's real cost, with no profiler: after `warmup` steps, cycles of blocks of `block` steps,
# one block per configuration in a shuffled order — every probe on ("all"), all off ("none"), or one probe off
# (its name) — each block timed by the thread's CPU clock. A probe is switched off the way the session does it
# after a probe's error (`enabled = False`): its hooks stay installed and return at once.
TOGGLE_DRIVER = '''
import json, random, runpy, sys, time
warmup, cycles, block, out, loop = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
import torch
from torch.optim import optimizer as optim_api

seen = 0
session = None
plan = []
times = {}
started = None


def apply(config):
    for probe in session.probes:
        probe.enabled = config == "all" or (config != "none" and probe.name != config)


def window(optimizer, args, kwargs):
    global seen, session, plan, started
    seen += 1
    if seen < warmup or (seen - warmup) % block:
        return
    now = time.thread_time()
    if seen == warmup:
        session = next(h.__self__ for h in optim_api._global_optimizer_post_hooks.values()
                       if hasattr(getattr(h, "__self__", None), "probes"))
        names = [p.name for p in session.probes if p.enabled]
        rng = random.Random(0)
        for _ in range(cycles):
            order = ["all", "none", *names]
            rng.shuffle(order)
            plan.extend(order)
        plan.reverse()
    elif started is not None:
        times.setdefault(started[0], []).append((now - started[1]) / block)
    if not plan:
        apply("all")
        with open(out, "w") as fh:
            json.dump(times, fh)
        raise SystemExit(0)  # the loop runs "forever": this ends it, through the script, as sys.exit would
    config = plan.pop()
    apply(config)
    started = (config, time.thread_time())


optim_api.register_optimizer_step_post_hook(window)
sys.argv = [loop, "0", "1000000", out + ".result", "1"]
runpy.run_path(loop, run_name="__main__")
'''


def toggle_loop(script: Path, probes: list[str], args: argparse.Namespace, work: Path) -> dict[str, list[float]]:
    """Seconds per step of each block, by configuration (see TOGGLE_DRIVER)."""
    driver = work / "toggle.py"
    driver.write_text(textwrap.dedent(TOGGLE_DRIVER))
    out = work / "toggle.json"
    out.unlink(missing_ok=True)
    argv = [str(args.warmup), str(args.cycles), str(args.toggle_block), str(out), str(script)]
    cmd = [sys.executable, "-m", "torchdoctor.cli", "run", str(driver), "--out", str(work / "run"),
           "--format", "json", "--hang-timeout", "0", *probes, "--", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    if not out.exists():
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())


def profile_loop(script: Path, probes: list[str] | None, args: argparse.Namespace, work: Path,
                 name: str) -> tuple[list[dict], dict]:
    """The profiles of each block of steps after the warm-up, plain (probes None) or under `torchdoctor run`,
    and the driver's account: the directories of torchdoctor's code in that process (`ours`), the profiler's
    cost per call (`event_s`)."""
    driver = work / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    out = work / f"{name}.prof"
    argv = [str(args.warmup), str(args.steps), str(args.block), str(out), str(script)]
    if probes is None:
        cmd = [sys.executable, str(driver), *argv]
    else:
        cmd = [sys.executable, "-m", "torchdoctor.cli", "run", str(driver), "--out", str(work / "run"),
               "--format", "json", "--hang-timeout", "0", *probes, "--", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    meta = Path(f"{out}.json")
    if not meta.exists():
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    info = json.loads(meta.read_text())
    return [pstats.Stats(f"{out}.{i}").stats for i in range(1, info["blocks"] + 1)], info


Func = tuple[str, int, str]


def attribute(stats: dict, info: dict) -> tuple[dict[Func, float], dict[Func, int], float]:
    """Seconds and calls per torchdoctor function, and the profile's total seconds.

    A function's time: its own time, plus the calls it makes into code that is not ours, less (a) a
    wrapper's call of the function it wraps (the user's own work: a wrapper is a function our code
    registered with probes/transparent.py, and what it wraps is any library function it calls, builtins
    aside) and (b) our functions that such a call ran in turn (charged to themselves). From each, the
    profiler's own cost (`event_s` per call) of the calls made in that time is taken out."""
    ours, event_s = info.get("ours", []), info["event_s"]
    wrappers = {tuple(w) for w in info.get("wrappers", [])}

    def is_ours(func: Func) -> bool:
        return any(func[0].startswith(d + os.sep) for d in ours)

    callees: dict[Func, list[tuple[Func, tuple]]] = collections.defaultdict(list)
    for callee, (_, _, _, _, callers) in stats.items():
        for caller, edge in callers.items():
            callees[caller].append((callee, edge))
    # our time inside each library function (our hooks and callbacks it ran), to take out of its callers' share
    reentered: dict[Func, float] = collections.defaultdict(float)
    for callee, (_, _, _, _, callers) in stats.items():
        if is_ours(callee):
            for caller, edge in callers.items():
                if not is_ours(caller):
                    reentered[caller] += edge[3]
    # calls per call of each library function, its own and those below it (ours left out), for the profiler's cost
    below: dict[Func, float] = {f: 1.0 for f in stats}
    for _ in range(12):  # a fixed point; recursion converges in a few rounds
        below = {f: 1.0 + sum(edge[0] / max(stats[f][1], 1) * below[g]
                              for g, edge in callees[f] if g in below and not is_ours(g)) for f in stats}
        below = {f: min(v, 1e4) for f, v in below.items()}
    seconds: dict[Func, float] = {}
    calls: dict[Func, int] = {}
    total = 0.0
    for func, (_, ncalls, own, _, _) in stats.items():
        total += own - event_s * ncalls
        if not is_ours(func):
            continue
        spent = own - event_s * ncalls
        for callee, edge in callees[func]:
            if is_ours(callee):
                continue
            if callee[0] != "~" and func in wrappers:
                continue  # the wrapped original
            share = edge[0] / stats[callee][1] if stats[callee][1] else 0.0
            spent += max(edge[3] - reentered[callee] * share - event_s * edge[0] * below[callee], 0.0)
        seconds[func] = max(spent, 0.0)
        calls[func] = ncalls
    return seconds, calls, total


def by_module(per_function: dict[Func, float] | dict[Func, int]) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for func, value in per_function.items():
        out[os.path.basename(func[0])] += value
    return out


def summary(blocks: list, plain: list[dict], plain_info: dict, info: dict, args: argparse.Namespace) -> dict:
    """Medians over the blocks (a neighbour's burst, or the scheduler's, lands in one block, not in all)."""
    per = 1e6 / args.block

    def medians(rows: list[dict]) -> dict:
        keys = {k for row in rows for k in row}
        return {k: statistics.median(row.get(k, 0.0) for row in rows) * per for k in keys}

    modules = medians([by_module(seconds) for seconds, _, _ in blocks])
    functions = medians([seconds for seconds, _, _ in blocks])
    function_calls: dict = collections.defaultdict(int)
    for _, calls, _ in blocks:
        for f, n in calls.items():
            function_calls[f] += n
    module_calls = by_module(function_calls)
    plain_us = statistics.median(attribute(stats, plain_info)[2] for stats in plain) * per
    return {
        "plain_us_per_step": plain_us,
        "probed_us_per_step": statistics.median(total for _, _, total in blocks) * per,
        "profiler_us_per_call": info["event_s"] * 1e6,
        "torchdoctor_us_per_step": statistics.median(sum(b[0].values()) for b in blocks) * per,
        "modules": {m: {"us_per_step": modules[m], "calls_per_step": module_calls[m] / args.steps}
                    for m in sorted(modules, key=lambda m: -modules[m])},
        "functions": {f"{os.path.basename(f[0])}:{f[1]}({f[2]})": {
            "us_per_step": functions[f], "calls_per_step": function_calls[f] / args.steps}
            for f in sorted(functions, key=lambda f: -functions[f])[:args.functions]},
    }


def toggled(times: dict[str, list[float]]) -> dict:
    """Each probe's cost per step: the "all" block of a cycle less the block of that cycle with the probe off,
    the median over the cycles (paired by cycle: drift between cycles cancels)."""
    base = times["all"]

    def cost(config: str) -> float:
        return statistics.median(a - b for a, b in zip(base, times[config], strict=False)) * 1e6

    def spread(config: str) -> float:
        """Half the interquartile range of the differences over √cycles: about the median's uncertainty."""
        diffs = sorted(a - b for a, b in zip(base, times[config], strict=False))
        q1, q3 = diffs[len(diffs) // 4], diffs[(3 * len(diffs)) // 4]
        return (q3 - q1) / 2 / max(len(diffs), 1) ** 0.5 * 1e6 * 1.5

    probes = {name: cost(name) for name in times if name not in ("all", "none")}
    return {
        "all_us_per_step": statistics.median(base) * 1e6,
        "none_us_per_step": statistics.median(times["none"]) * 1e6,
        "probes_us_per_step": cost("none"),
        "cycles": len(base),
        "per_probe_us_per_step": dict(sorted(probes.items(), key=lambda kv: -kv[1])),
        "per_probe_spread_us": {name: spread(name) for name in probes},
    }


def print_toggle(loop: str, r: dict, args: argparse.Namespace) -> None:
    print(f"{loop}: each probe switched off in turn, {r['cycles']} cycles of {args.toggle_block}-step blocks; "
          f"thread CPU µs per step, median over the cycles of (all on) - (this one off) ± about its uncertainty "
          "(on a loaded machine it can exceed the costs)")
    print(f"  all probes on {r['all_us_per_step']:.0f} µs/step, all off {r['none_us_per_step']:.0f}: the probes' "
          f"work {r['probes_us_per_step']:.0f} µs/step ({r['probes_us_per_step'] / r['none_us_per_step']:.1%}; "
          "their hooks and wrappers stay installed when off)")
    for name, us in r["per_probe_us_per_step"].items():
        print(f"  {name:<22} {us:>8.1f} ± {r['per_probe_spread_us'][name]:.1f}")
    print(f"  {'sum':<22} {sum(r['per_probe_us_per_step'].values()):>8.1f}\n")


def print_profile(loop: str, r: dict, probes: list[str], args: argparse.Namespace) -> None:
    ours_us = r["torchdoctor_us_per_step"]
    print(f"{loop}: torchdoctor run {' '.join(probes) or '(default probes)'} under cProfile, {args.steps} steps "
          f"after {args.warmup}; µs per step: the median over blocks of {args.block} steps, thread CPU time, "
          "less the profiler's own (see the docstring)")
    print(f"  plain {r['plain_us_per_step']:.0f} µs/step, probed {r['probed_us_per_step']:.0f} (probed / plain "
          f"{r['probed_us_per_step'] / r['plain_us_per_step']:.3f}×); torchdoctor frames {ours_us:.0f} µs/step "
          f"({ours_us / r['plain_us_per_step']:.1%} of plain); the profiler's cost, taken out: "
          f"{r['profiler_us_per_call']:.2f} µs per call")
    print(f"  {'module':<22} {'calls/step':>10} {'µs/step':>9}")
    for module, m in r["modules"].items():
        if m["calls_per_step"] >= 0.01 or m["us_per_step"] >= 0.05:
            print(f"  {module:<22} {m['calls_per_step']:>10.2f} {m['us_per_step']:>9.1f}")
    if r["functions"]:
        print(f"  {'function':<48} {'calls/step':>10} {'µs/step':>9}")
        for name, m in r["functions"].items():
            print(f"  {name:<48} {m['calls_per_step']:>10.2f} {m['us_per_step']:>9.1f}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("both", "profile", "toggle"), default="both",
                        help="profile: cProfile's counts and attribution; toggle: each probe's real cost, "
                        "switched off block by block; both (default)")
    parser.add_argument("--steps", type=int, default=300, help="profile: steps profiled")
    parser.add_argument("--warmup", type=int, default=60, help="steps before measuring (the dense phase is 40)")
    parser.add_argument("--block", type=int, default=25, help="profile: steps per block (--steps: a multiple)")
    parser.add_argument("--cycles", type=int, default=12, help="toggle: cycles of one block per configuration")
    parser.add_argument("--toggle-block", type=int, default=10, help="toggle: steps per block")
    parser.add_argument("--loop", action="append", default=[], help="mlp, transformer (default: both)")
    parser.add_argument("--probe", default=None, help="torchdoctor run's --probe (default: the default probes)")
    parser.add_argument("--functions", type=int, default=0, help="profile: also list the N costliest functions")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    if args.steps % args.block or args.steps < args.block:
        parser.error("--steps must be a multiple of --block")
    loops = args.loop or list(MODELS)
    unknown = set(loops) - set(MODELS)
    if unknown:
        parser.error(f"unknown loop(s): {', '.join(sorted(unknown))}; choose from {', '.join(MODELS)}")
    probes = ["--probe", args.probe] if args.probe else []
    report: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for loop in loops:
            script = work / f"{loop}.py"
            script.write_text(textwrap.dedent(LOOP.format(model=MODELS[loop])))
            report[loop] = {}
            if args.mode != "toggle":
                plain, plain_info = profile_loop(script, None, args, work, "plain")
                probed, info = profile_loop(script, probes, args, work, "probed")
                blocks = [attribute(stats, info) for stats in probed]
                report[loop]["profile"] = summary(blocks, plain, plain_info, info, args)
            if args.mode != "profile":
                report[loop]["toggle"] = toggled(toggle_loop(script, probes, args, work))
    for loop, r in report.items():
        if "toggle" in r:
            print_toggle(loop, r["toggle"], args)
        if "profile" in r:
            print_profile(loop, r["profile"], probes, args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

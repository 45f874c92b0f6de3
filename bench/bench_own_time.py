"""Time spent in torchdoctor's own code inside each training step: a figure the machine's noise barely moves.

Side-by-side ratios on a shared machine spread ±25% per round. This bench instead times every entry point
torch calls into torchdoctor (the session's optimizer hooks with every probe's before/after_step, the
backward wrapper's subscribers, the module hooks, the evidence writers) from inside the probed process,
through a `sitecustomize` put on PYTHONPATH, and divides by the steps after a warm-up. What it cannot see:
the cache lines those calls take from the step (indirect cost), which only the side-by-side bench measures.

    python bench/bench_own_time.py [--loop mlp|transformer] [--steps 1500] [-- torchdoctor run args…]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_run import LOOP, MODELS  # noqa: E402

# (module of torchdoctor.probes, class, methods); nested entries are shown but not added to the total
ENTRIES = [
    ("session", "Session", ["_pre_hook", "_post_hook"], True),
    ("forwards", "ForwardWatch", ["_instance_pre", "_instance_post"], True),
    ("nan", "NanProbe", ["_root_pre", "_before_backward"], True),
    ("gradflow", "GradflowProbe", ["_any_step", "_backward"], True),
    ("accumulation", "AccumulationProbe", ["_any_step", "_backward"], True),
    ("schedule", "ScheduleProbe", ["_counted"], True),
    ("amp", "AmpProbe", ["_backward"], True),
    ("validation", "ValidationProbe", ["_backward"], True),
    ("nan", "NanProbe", ["before_step", "after_step"], False),
    ("memory", "MemoryProbe", ["after_step"], False),
    ("validation", "ValidationProbe", ["_start", "_end"], False),
    ("session", "Session", ["_write_step"], False),
    ("evidence", "EvidenceWriter", ["write", "line"], False),
    ("stepfile", "StepFile", ["write"], False),
]

SITE = '''
import atexit, functools, importlib, json, os, time
ENTRIES = {entries!r}
TIMES = {{}}
def _wrap(cls, name, label):
    fn = cls.__dict__[name]
    clock = time.perf_counter
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        started = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES.setdefault(label, []).append(clock() - started)
    setattr(cls, name, timed)
for module, cls_name, names, top in ENTRIES:
    cls = getattr(importlib.import_module("torchdoctor.probes." + module), cls_name, None)
    for name in names:
        if cls is not None and name in cls.__dict__:
            _wrap(cls, name, (cls_name + "." + name, top))
def _dump():
    if TIMES:
        with open(os.environ["TORCHDOCTOR_OWN_TIME"], "w") as fh:
            json.dump([[label, top, values] for (label, top), values in TIMES.items()], fh)
if os.environ.get("TORCHDOCTOR_OWN_TIME"):
    atexit.register(_dump)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--skip", type=int, default=100, help="calls left out at the start (warm-up)")
    parser.add_argument("run_args", nargs="*", help="torchdoctor run arguments (after --), e.g. --probe nan")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "site").mkdir()
        (work / "site" / "sitecustomize.py").write_text(SITE.format(entries=ENTRIES))
        script = work / "loop.py"
        script.write_text(textwrap.dedent(LOOP.format(model=MODELS[args.loop])))
        times = work / "times.json"
        env = {**os.environ, "PYTHONPATH": str(work / "site"), "TORCHDOCTOR_OWN_TIME": str(times)}
        cmd = [sys.executable, "-m", "torchdoctor.cli", "run", str(script), "--out", str(work / "run"),
               "--hang-timeout", "0", *args.run_args, "--", "0", str(args.steps), str(work / "rate.json"), "1"]
        subprocess.run(cmd, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        rate = json.loads((work / "rate.json").read_text())
        rows = json.loads(times.read_text()) if times.exists() else []
    steps = args.steps - args.skip
    step_us = 1e6 / rate["steps_per_cpu_s"]
    print(f"{args.loop}, torchdoctor run {' '.join(args.run_args) or '(default probes)'}: {step_us:.0f} µs "
          f"per step (CPU), our code per step after the first {args.skip}:")
    total = 0.0
    for label, top, values in sorted(rows, key=lambda r: -sum(r[2][args.skip:])):
        per_step = sum(values[args.skip:]) / steps * 1e6
        total += per_step if top else 0.0
        print(f"  {'' if top else '  (inside) '}{label:<34} {per_step:8.1f} µs/step  {len(values)} calls")
    print(f"total {total:.1f} µs per step = {total / step_us:.1%} of the step")


if __name__ == "__main__":
    main()

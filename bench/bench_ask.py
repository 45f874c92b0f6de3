"""Start-up cost of `torchdoctor ask`, side by side with `python -c "import typer, rich"`.

Runs the installed console script end to end (stdout captured) on a few different texts,
a pasted traceback among them, alternating with the baseline, N times each, after a warm-up
with PYTHONDONTWRITEBYTECODE removed from the environment so that .pyc files exist and the rule
data is precompiled (rules/cache.py: the user cache directory), as on a user's machine. Prints
both medians and the median ratio (goal: <= 1.5).

    python bench/bench_ask.py [-n 30]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TRACEBACK = """\
Traceback (most recent call last):
  File "train.py", line 88, in <module>
    loss.backward()
  File "/opt/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
    torch.autograd.backward(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 23.64 GiB \
of which 1.12 GiB is free. Including non-PyTorch memory, this process has 22.50 GiB memory in use. Of the allocated \
memory 18.20 GiB is allocated by PyTorch, and 3.90 GiB is reserved by PyTorch but unallocated.
"""

TEXTS = [
    "OOM after a few batches",
    "trainign is sooo slow, GPU util 30 percent",
    "my loss goes nan with bf16 under DDP after the 3rd epoch",
    TRACEBACK,
]


def console_script() -> str:
    here = Path(sys.executable).parent / "torchdoctor"
    found = str(here) if here.exists() else shutil.which("torchdoctor")
    if not found:
        sys.exit("bench_ask: the `torchdoctor` console script is not installed (pip install -e .)")
    return found


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1, 3):
        sys.exit(f"bench_ask: {cmd[:2]} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-400:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=30, help="runs of each command (default 30)")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(NO_COLOR="1", COLUMNS="100")
    script = console_script()
    baseline = [sys.executable, "-c", "import typer, rich"]
    asks = [[script, "ask", text] for text in TEXTS]

    for cmd in [*asks, baseline]:  # warm-up: writes .pyc and the marshal caches
        timed(cmd, env)

    ask_times: list[float] = []
    base_times: list[float] = []
    ratios: list[float] = []
    for i in range(args.n):
        a = timed(asks[i % len(asks)], env)
        b = timed(baseline, env)
        ask_times.append(a)
        base_times.append(b)
        ratios.append(a / b)

    ask_med, base_med = statistics.median(ask_times), statistics.median(base_times)
    print(f"runs: {args.n} each, alternating; texts: {len(TEXTS)} (one a pasted traceback)")
    print(f"torchdoctor ask            median {ask_med * 1000:7.1f} ms")
    print(f"python -c 'import typer, rich'  median {base_med * 1000:7.1f} ms")
    print(f"ratio of medians: {ask_med / base_med:.2f}   median of per-pair ratios: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()

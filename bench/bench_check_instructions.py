"""bench_check_cpu's ratio in instructions executed (valgrind), a figure the machine's load cannot move.

    python bench/bench_check_instructions.py                      # this checkout's venv
    python bench/bench_check_instructions.py --python OTHER/.venv/bin/python   # another checkout, same corpus

On a shared 2-core machine at load 5-9 the CPU-second ratio of bench_check_cpu.py swings by +-0.05 between runs of
the same code, more than most single changes move it. Here three processes run under `valgrind --tool=cachegrind
--cache-sim=no`: one that only starts up (imports, the rule registry, 20 files through each side), one that then
runs bare parse+walk over the corpus, one that then runs the engine (all rules and the project pass, --no-torch).
Each side's count is its process's count less the start-up one. Instructions are not seconds: the engine's Python
runs at fewer instructions per cycle than the parser's C, so its CPU-second ratio is lower than this one; use this to
compare two checkouts, and bench_check_cpu.py for the figure itself. About 5 minutes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_SIDE = """
import sys
sys.path.insert(0, {here!r})
import bench_check_cpu as b
files = b.corpus(import_torch=False)
b.engine(files[:20])
b.bare(files[:20])
if {side!r} == "bare":
    b.bare(files)
elif {side!r} == "engine":
    b.engine(files)
"""
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(python: str, side: str) -> int:
    proc = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", python, "-c",
         _SIDE.format(here=str(HERE), side=side)],
        capture_output=True, text=True,
    )
    found = _REFS.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"bench_check_instructions: the {side} run failed: {proc.stderr.strip()[-300:]}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torchdoctor is measured")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench_check_instructions: valgrind is not installed", file=sys.stderr)
        return 2
    start = instructions(args.python, "start")
    bare = instructions(args.python, "bare") - start
    engine = instructions(args.python, "engine") - start
    print(f"bare parse+walk: {bare / 1e9:.2f} G instructions  engine, all rules + project pass: {engine / 1e9:.2f} G  "
          f"ratio: {bare / engine:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

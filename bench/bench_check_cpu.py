"""`check`'s engine against a bare parse, in CPU seconds of one process: a ratio that holds up on a busy machine.

    python bench/bench_check_cpu.py              # best of 3 alternated rounds
    python bench/bench_check_cpu.py --rounds 5
    python bench/bench_check_cpu.py --no-torch   # torch found on disk, never imported: the process `check` runs in

bench_check.py times wall clock, so on a shared machine its engine row swings with the load (0.40-0.84x of bare
parse+walk in one afternoon on 2 cores at load 4-8). Here both sides run in the same process, alternated, and are
timed with `time.process_time()`: the time other processes take from the CPU does not count. The corpus is the same
(torch/{nn,optim,distributed} of the installed torch), and the engine runs every rule, as in bench_check.py, and then
the project pass over the whole corpus (cross-file analysis on, as `check` runs over a folder).

To compare two checkouts, run each one's copy with its own venv, alternately, and report the load average.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from pathlib import Path

TREES = ("nn", "optim", "distributed")


def corpus(import_torch: bool = True) -> list[Path]:
    if import_torch:
        import torch

        root = Path(torch.__file__).parent
    else:
        # `torchdoctor check` never imports torch. Importing it here leaves millions of objects for the garbage
        # collector's full passes, a cost both sides then pay and that lifts the ratio towards 1 (0.61x with it,
        # about 0.55x without, on the same code): --no-torch measures in a process like the CLI's.
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            raise SystemExit("bench_check_cpu: torch is not installed here (its files are the corpus)")
        root = Path(spec.origin).parent
    return sorted(p for tree in TREES for p in (root / tree).rglob("*.py"))


def bare(files: list[Path]) -> None:
    for path in files:
        for _ in ast.walk(ast.parse(path.read_bytes())):
            pass


def engine(files: list[Path]) -> None:
    from torchdoctor.check import project_classes
    from torchdoctor.rules.static import registry
    from torchdoctor.rules.static.engine import Options, analyse_file, project_findings

    options = Options(codes=tuple(registry.rules()))
    root = os.path.commonpath([str(p) for p in files])
    # the pre-pass over class headers, as `check` runs it before the analysis (semantic/projectclasses.py)
    # (in one process `check` keeps the bytes the pre-pass read for the analysis: each file is read once)
    sources: dict[str, bytes] = {}
    options.project = project_classes([(str(p), str(p)) for p in files], [root], options.max_bytes, sources)
    results = [analyse_file(str(path), str(path), options, sources.pop(str(path), None)) for path in files]
    # Cross-file analysis on, as `check` runs it over a folder: the results are kept until the project pass
    # joins the facts every file left (rules/static/project.py).
    project_findings({}, results, options.codes, [root])


def cpu_seconds(fn, files: list[Path]) -> float:
    started = time.process_time()
    fn(files)
    return time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds; the best of each side is kept")
    parser.add_argument("--no-torch", action="store_true", help="find torch's files without importing torch")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        print("bench_check_cpu: --rounds must be at least 1", file=sys.stderr)
        return 2
    files = corpus(import_torch=not args.no_torch)
    engine(files[:20])  # imports, the vocabulary and the rule registry load outside the measured rounds
    bare_times, engine_times = [], []
    for _ in range(args.rounds):
        bare_times.append(cpu_seconds(bare, files))
        engine_times.append(cpu_seconds(engine, files))
    b, e = min(bare_times), min(engine_times)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    process = "torch not imported" if args.no_torch else "torch imported"
    print(f"files: {len(files)} ({process})  load: {load}  bare parse+walk: {len(files) / b:.0f} files/CPU-s  "
          f"engine, all rules: {len(files) / e:.0f} files/CPU-s  ratio: {b / e:.2f}x of bare")
    return 0


if __name__ == "__main__":
    sys.exit(main())

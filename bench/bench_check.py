"""Files per second of `torchdoctor check`, side by side with the practical limit and other linters.

    python bench/bench_check.py                          # corpus: the installed torch's nn, optim, distributed
    python bench/bench_check.py --jobs 2 --repeat 5
    python bench/bench_check.py --tools-venv /tmp/td-bench-tools --install-tools

Measured in one run, on the same copy of the corpus, best of --repeat (interleaved, so load on
the machine hits every contender alike):

- bare parse: `ast.parse` + one `ast.walk` per file, one process (the practical limit in Python),
  and the same across --jobs processes;
- torchdoctor, all rules, in one process (engine only) and end to end through the CLI
  (`check --format json`, start-up, report and fix reports included) with --jobs 1 and --jobs N;
- torchfix and hotpath-ai from a throwaway venv (--tools-venv; --install-tools creates it with
  pip from the package registry). Nothing is installed into the project's own venv. A tool that
  is not there is shown with the figures quoted in issue 3, marked "reference, not measured here".
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

TREES = ("nn", "optim", "distributed")
REFERENCE = {  # issue 3, measured elsewhere on torch/nn with 2 cores
    "torchfix": (3.0, 6.0),
    "hotpath-ai": (225.0, 225.0),
}
TOOL_PACKAGES = {"torchfix": "torchfix", "hotpath-ai": "hotpath-ai"}


def torch_root() -> Path:
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        sys.exit("bench_check: torch is not installed; the corpus is its own source tree")
    return Path(next(iter(spec.submodule_search_locations)))


def copy_corpus(dest: Path) -> list[Path]:
    """The three trees, copied (outside any .venv, which other tools skip by default)."""
    root = torch_root()
    for tree in TREES:
        shutil.copytree(root / tree, dest / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return sorted(dest.rglob("*.py"))


# -- in-process measurements -----------------------------------------------------------------


def bare_files(paths: list[str]) -> int:
    nodes = 0
    for path in paths:
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read())
        for _ in ast.walk(tree):
            nodes += 1
    return nodes


def bare_parallel(files: list[Path], jobs: int, pool: ProcessPoolExecutor) -> None:
    paths = [str(p) for p in files]
    size = max(4, len(paths) // (jobs * 8))
    list(pool.map(bare_files, [paths[i : i + size] for i in range(0, len(paths), size)]))


def engine_single(files: list[Path]) -> int:
    from torchdoctor.rules.static import registry
    from torchdoctor.rules.static.engine import Options, analyse_file

    options = Options(codes=tuple(registry.rules()))
    return sum(len(analyse_file(str(p), str(p), options).results) for p in files)


def cli_check(corpus: Path, jobs: int) -> tuple[int, int]:
    proc = subprocess.run(
        [sys.executable, "-m", "torchdoctor.cli", "check", "--format", "json", "--select", "ALL", "--jobs", str(jobs), "."],
        cwd=corpus,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    if proc.returncode not in (0, 1):
        sys.exit(f"bench_check: torchdoctor check failed: {proc.stderr.strip()}")
    report = json.loads(proc.stdout)
    return len(report["findings"]), proc.returncode


# -- other tools ------------------------------------------------------------------------------


def tool_commands(venv: Path, corpus: Path, jobs: int) -> dict[str, list[str]]:
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    return {
        "torchfix": [str(bin_dir / "torchfix"), "--jobs", str(jobs), str(corpus)],
        "hotpath-ai": [str(bin_dir / "hotpath"), "analyze", str(corpus), "--format", "json"],
    }


def install_tools(venv: Path) -> None:
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *TOOL_PACKAGES.values()], check=False)


def run_tool(cmd: list[str]) -> tuple[float, int]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return time.perf_counter() - started, proc.returncode


# -- the run ----------------------------------------------------------------------------------


def best(times: list[float]) -> float:
    return min(times) if times else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 8), help="processes for the parallel runs")
    parser.add_argument("--repeat", type=int, default=3, help="repeats of the fast measurements (best is kept)")
    parser.add_argument("--tool-repeat", type=int, default=1, help="repeats of the external linters (slow)")
    parser.add_argument("--tools-venv", type=Path, default=Path(tempfile.gettempdir()) / "td-bench-tools")
    parser.add_argument("--install-tools", action="store_true", help="pip install torchfix and hotpath-ai into --tools-venv")
    args = parser.parse_args()

    if args.install_tools:
        install_tools(args.tools_venv)
    with tempfile.TemporaryDirectory(prefix="td-bench-") as tmp:
        corpus = Path(tmp) / "corpus"
        files = copy_corpus(corpus)
        n = len(files)
        paths = [str(p) for p in files]
        print(f"corpus: {n} files, {sum(p.stat().st_size for p in files) / 2**20:.1f} MiB "
              f"(torch/{{{','.join(TREES)}}} of {torch_root().parent.name}/torch), jobs={args.jobs}, "
              f"cores={os.cpu_count()}, python {sys.version.split()[0]}")

        times: dict[str, list[float]] = {k: [] for k in ("bare-1", "bare-N", "engine-1", "cli-1", "cli-N")}
        engine_single(files[:5])  # load the rules once, as a long-lived process would
        findings = 0
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            bare_parallel(files[:16], args.jobs, pool)  # start the workers before timing
            for _ in range(args.repeat):
                t = time.perf_counter()
                bare_files(paths)
                times["bare-1"].append(time.perf_counter() - t)
                t = time.perf_counter()
                bare_parallel(files, args.jobs, pool)
                times["bare-N"].append(time.perf_counter() - t)
                t = time.perf_counter()
                engine_single(files)
                times["engine-1"].append(time.perf_counter() - t)
                t = time.perf_counter()
                findings, _ = cli_check(corpus, 1)
                times["cli-1"].append(time.perf_counter() - t)
                t = time.perf_counter()
                cli_check(corpus, args.jobs)
                times["cli-N"].append(time.perf_counter() - t)

        tools: dict[str, float | None] = {}
        commands = tool_commands(args.tools_venv, corpus, args.jobs)
        for name, cmd in commands.items():
            if not Path(cmd[0]).exists():
                tools[name] = None
                continue
            runs = []
            for _ in range(args.tool_repeat):
                seconds, code = run_tool(cmd)
                if code not in (0, 1):
                    print(f"{name} exited {code}; its figure is left out")
                    break
                runs.append(seconds)
            tools[name] = n / best(runs) if runs else None

    rate = {k: n / best(v) for k, v in times.items()}
    rows = [
        ("bare ast.parse + ast.walk", "1 process", rate["bare-1"], "the practical limit"),
        ("bare ast.parse + ast.walk", f"{args.jobs} processes", rate["bare-N"], ""),
        ("torchdoctor engine, all rules", "1 process", rate["engine-1"], f"{rate['engine-1'] / rate['bare-1']:.0%} of bare, 1 process"),
        ("torchdoctor check (CLI, JSON)", "--jobs 1", rate["cli-1"], f"{rate['cli-1'] / rate['bare-1']:.0%} of bare, 1 process"),
        ("torchdoctor check (CLI, JSON)", f"--jobs {args.jobs}", rate["cli-N"], f"{rate['cli-N'] / rate['bare-N']:.0%} of bare, {args.jobs} processes"),
    ]
    for name, measured in tools.items():
        if measured is None:
            low, high = REFERENCE[name]
            figure = f"{low:g}-{high:g}" if low != high else f"{low:g}"
            rows.append((name, "reference, not measured here", (low + high) / 2, f"{figure} files/s quoted in issue 3"))
        else:
            rows.append((name, f"jobs={args.jobs}" if name == "torchfix" else "1 process", measured, "measured here"))

    print(f"\n{'contender':<32} {'mode':<30} {'files/s':>9}  note")
    for name, mode, value, note in rows:
        print(f"{name:<32} {mode:<30} {value:>9.1f}  {note}")
    print(f"\ntorchdoctor found {findings} findings in the corpus (all rules).")
    ours = rate["cli-N"]
    for name in ("torchfix", "hotpath-ai"):
        measured = tools.get(name)
        if measured:
            print(f"torchdoctor --jobs {args.jobs} vs {name}: {ours / measured:.1f}x (both measured here)")
        else:
            low, high = REFERENCE[name]
            print(f"torchdoctor --jobs {args.jobs} vs {name}: {ours / high:.1f}x-{ours / low:.1f}x against the quoted figure (not measured here)")
    print(f"torchdoctor --jobs 1 vs hotpath-ai: {rate['cli-1'] / (tools.get('hotpath-ai') or REFERENCE['hotpath-ai'][0]):.2f}x")


if __name__ == "__main__":
    main()

"""What report.html costs a run: building the page against the analysis of the same evidence, as a ratio.

The runner analyses a run's evidence, writes report.json, then builds report.html from the same events
(runner.write_html, passed the events the analysis read). This times both on the same run directories: the
five an H100 recorded (tests/data/gpu_h100, 0-400 steps) and synthetic step files of 1,000, 10,000 and
100,000 steps (every per-step number the probes write). Median of `--rounds` runs each; the page's size too.

    python bench/bench_report_html.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "data" / "gpu_h100"


def synthetic(folder: Path, steps: int) -> Path:
    with open(folder / "steps.rank0.jsonl", "w") as fh:
        for step in range(1, steps + 1):
            fh.write(json.dumps({"kind": "step", "step": step, "t": step * 0.01,
                                 "memory": {"rss_mib": 300 + step * 1e-3}, "data": {"wait_ms": 0.2},
                                 "nan": {"loss": 1 / step, "grad_norm": 1.0}}) + "\n")
    (folder / "events.rank0.jsonl").write_text(json.dumps({"kind": "start", "t": 0.0, "step": 0, "rank": 0,
                                                           "world_size": 1}) + "\n")
    return folder


def timed(rounds: int, fn, *args, **kwargs) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def analysis(folder: Path, probes: list[str]):
    """What the runner does before report.json: read the evidence, analyse it."""
    from torchdoctor.analysis import analyse
    from torchdoctor.analysis.evidence import Outcome, RunEvidence, read_events
    from torchdoctor.rules import catalog

    run = RunEvidence(run_dir=folder, cwd=str(ROOT), target="x.py", project=str(ROOT), probes=probes,
                      events=read_events(folder), outcome=Outcome("completed", 0, None, 1.0),
                      thresholds=catalog.load_toml("thresholds.toml"))
    return run, analyse(run)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from torchdoctor.model import Report, RunInfo
    from torchdoctor.render.html_page import page

    probes = ["memory", "env", "nan", "data", "profile", "schedule"]
    dirs = [(p.name, p) for p in sorted(RECORDED.iterdir())]
    scratch = Path(tempfile.mkdtemp(prefix="bench-report-html-"))
    for steps in (1_000, 10_000, 100_000):
        folder = scratch / f"synthetic-{steps}"
        folder.mkdir()
        dirs.append((f"synthetic {steps:,} steps", synthetic(folder, steps)))
    print(f"{'run directory':<26}{'steps':>8}{'analysis ms':>13}{'page ms':>10}{'page/analysis':>15}{'page KB':>9}")
    for name, folder in dirs:
        t_analysis, (run, found) = timed(args.rounds, analysis, folder, probes)
        steps = run.steps_completed(0)
        report = Report(command="run", target=name, symptoms=found.symptoms,
                        run=RunInfo(exit_code=0, steps_completed=steps, stopped="completed", duration_s=1.0,
                                    probes=probes, measurements=found.measurements))
        t_page, text = timed(args.rounds, page, report, folder, events=run.events)
        print(f"{name:<26}{steps:>8}{t_analysis * 1e3:>13.1f}{t_page * 1e3:>10.1f}{t_page / t_analysis:>14.2f}x"
              f"{len(text.encode()) / 1024:>9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reports from every door on the fixtures the suite already keeps, for the checks that hold across doors.

- ask: the public sample (tests/data/ask_public.jsonl), every signature's `example`, the pasted logs
  of tests/fixtures/triage, and a question naming each framework `ask` recognises;
- check: every rule's fixtures (tests/fixtures/check/rules/*), the healthy scripts and the framework scripts
  (tests/fixtures/frameworks: Lightning, the Trainer, Accelerate), one report each;
- run: the H100 recordings (tests/data/gpu_h100/) analysed again on today's code, and a handful of run
  fixtures run for real (`live_runs`), chosen for the measurements the wording is checked against:
  non-finite gradients, the optimizer class of a resume, gradient accumulation.

Each yields `(name, Report)`; tests/test_evidence.py and tests/test_consistency.py read them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import tomllib

from torchdoctor.model import Report

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
LIVE_RUNS = ("nan_grad_norm.py", "resume_optimizer.py", "proto_accum_bad.py")
# Questions naming a training framework, so that ask's reports carry a framework's knobs too
# (`ask` recognises Lightning and the Trainer by the user's words; Accelerate reads as "distributed").
FRAMEWORK_QUESTIONS = (
    ("ask:framework:lightning", "my lightning model's loss goes nan after a few hundred steps, gradients explode"),
    ("ask:framework:hf-trainer", "loss is nan with the HF Trainer and TrainingArguments fp16=True"),
)


def ask_texts() -> list[tuple[str, str]]:
    texts = []
    for line in (TESTS / "data" / "ask_public.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            texts.append((f"ask:{row['id']}", row["text"]))
    with open(ROOT / "rules" / "data" / "signatures.toml", "rb") as fh:
        for sig in tomllib.load(fh)["signature"]:
            texts.append((f"ask:signature:{sig['id']}", sig["example"]))
    for log in sorted((FIXTURES / "triage").glob("*.log")):
        texts.append((f"ask:{log.name}", log.read_text()))
    return texts + list(FRAMEWORK_QUESTIONS)


def ask_reports() -> Iterator[tuple[str, Report]]:
    from torchdoctor.ask import build_report

    for name, text in ask_texts():
        yield name, build_report(text)


def check_paths() -> list[Path]:
    rules = sorted((FIXTURES / "check" / "rules").glob("*/*.py"))
    healthy = sorted((FIXTURES / "check" / "healthy").rglob("*.py"))
    return rules + healthy + sorted((FIXTURES / "frameworks").glob("*.py"))  # Lightning, Trainer, Accelerate scripts


def check_reports() -> Iterator[tuple[str, Report]]:
    from torchdoctor.check import CheckRequest, build_report, prepare
    from torchdoctor.diagnosis import diagnose

    for path in check_paths():
        request = CheckRequest(paths=[str(path)], fmt="json", jobs=1)
        report = build_report(request, prepare(request))
        diagnose(report)
        yield f"check:{path.relative_to(FIXTURES)}", report


def recorded_run_reports() -> Iterator[tuple[str, Report]]:
    """The H100 recordings, analysed and diagnosed here as `run` would (its measurements included)."""
    from torchdoctor.analysis import analyse
    from torchdoctor.analysis.evidence import Outcome, RunEvidence, read_events
    from torchdoctor.diagnosis import diagnose
    from torchdoctor.model import RunInfo
    from torchdoctor.rules import catalog

    for run_dir in sorted((TESTS / "data" / "gpu_h100").iterdir()):
        recorded = json.loads((run_dir / "report.json").read_text())["run"]
        outcome = Outcome(recorded["stopped"], recorded["exit_code"], recorded["signal"], recorded["duration_s"])
        run = RunEvidence(run_dir=run_dir, cwd=str(ROOT), target=f"bench/gpu/scripts/{run_dir.name}.py",
                          project=str(ROOT), probes=recorded["probes"], events=read_events(run_dir), outcome=outcome,
                          thresholds=catalog.load_toml("thresholds.toml"))
        found = analyse(run)
        info = RunInfo(exit_code=recorded["exit_code"], steps_completed=recorded["steps_completed"],
                       stopped=recorded["stopped"], duration_s=recorded["duration_s"], measurements=found.measurements)
        report = Report(command="run", target=run.target, symptoms=found.symptoms, contexts=found.contexts, run=info)
        yield f"run:gpu_h100/{run_dir.name}", diagnose(report)


def live_runs(out: Path) -> list[tuple[str, dict]]:
    """A handful of run fixtures under the real `torchdoctor run`, as JSON reports."""
    from tests.conftest import cli

    reports = []
    for script in LIVE_RUNS:
        proc = cli("run", "--format", "json", "--out", str(out / script), str(FIXTURES / "run" / script), timeout=300)
        assert proc.stdout_text.strip(), proc.stderr_text[-2000:]
        reports.append((f"run:{script}", json.loads(proc.stdout_text)))
    return reports

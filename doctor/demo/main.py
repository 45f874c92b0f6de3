"""`torchdoctor demo`: the bundled patient, diagnosed through every door.

The demo copies `train_demo.py` (five planted problems, see its docstring)
into a fresh temporary folder, so nothing in the user's working directory is
read or written, and leaves it there with the run directory, so the next steps
the report names (by absolute path) work. Then:

1. `check` reads it without running it (static rules -> findings);
2. `run` trains it for real on the CPU under the probes (measurements);
3. both kinds of evidence go into one report: a mistake seen by a rule and by
   a probe becomes one symptom with both its line and its numbers.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from torchdoctor import exitcodes
from torchdoctor.model import Report

SCRIPT = Path(__file__).with_name("train_demo.py")


def static_report(script: Path) -> Report:
    from torchdoctor.check import CheckRequest, build_report, prepare

    request = CheckRequest(paths=[str(script)])
    return build_report(request, prepare(request))


def run_report(script: Path, run_dir: Path) -> Report:
    from torchdoctor.run_options import RunRequest, make_plan
    from torchdoctor.runner import build_report, evidence_of, supervise, write_report

    # The script's own output goes to stderr, so the report alone is on stdout.
    target = [str(script), "--checkpoint", "demo_checkpoint.pt"]
    plan = make_plan(RunRequest(target=target, out=str(run_dir), fmt="json", hang_timeout=60, timeout=300))
    result = supervise(plan)
    report = build_report(plan, evidence_of(plan, result))
    write_report(report, plan.run_dir)
    return report


def combine(static: Report, measured: Report, script_name: str, workdir: Path | None = None) -> Report:
    """One report from both doors. With `workdir`, the commands and artifact paths it names are absolute,
    so they work from the user's own folder (the demo runs in a temporary one)."""
    from torchdoctor.diagnosis import diagnose

    # `run` reads the script with check's rules too, and keeps each finding its measurements confirm as
    # static evidence (analysis/static.py): taking check's symptoms for those as well listed every
    # confirmed finding twice. Only the findings the run did not carry are added.
    carried = [ev for s in measured.symptoms for ev in s.evidence if ev.kind == "static"]
    static_only = [s for s in static.symptoms if not any(ev in carried for ev in s.evidence)]
    report = Report(
        command="demo",
        target=script_name,
        findings=static.findings,
        symptoms=[*static_only, *measured.symptoms],
        contexts=sorted({*static.contexts, *measured.contexts}),
        run=measured.run,
        environment=measured.environment,
        artifacts={k: str(workdir / v) if workdir else v for k, v in measured.artifacts.items()},
        notes=[
            f"The demo patient: {script_name}, a small classifier with five planted problems, copied into a "
            "temporary folder, read by `torchdoctor check` and trained for real under `torchdoctor run`.",
            *measured.notes,
        ],
    )
    diagnose(report, target_hint=str(workdir / script_name) if workdir else script_name)
    report.notes.append(
        "On your own script: `torchdoctor check train.py`, `torchdoctor run train.py --steps 50`, "
        'or describe a problem: `torchdoctor ask "loss goes nan after epoch 3"`.'
    )
    return report


def run_demo(fmt: str, details: bool = False) -> int:
    from torchdoctor.render import render

    workdir = Path(tempfile.mkdtemp(prefix="torchdoctor-demo-"))
    shutil.copyfile(SCRIPT, workdir / SCRIPT.name)
    sys.stderr.write(f"torchdoctor demo: checking and running {SCRIPT.name} in {workdir}\n")
    sys.stderr.flush()
    here = os.getcwd()
    os.chdir(workdir)  # paths in the report read `train_demo.py:71`; nothing lands in the user's folder
    try:
        script = Path(SCRIPT.name)
        static = static_report(script)
        measured = run_report(script, Path("run"))
        report = combine(static, measured, SCRIPT.name, workdir)
        from torchdoctor.runner import write_html

        write_html(report, Path("run"))  # the page shows both doors, as the terminal does
    finally:
        os.chdir(here)
        # keep the patient (the next steps run it) and the run directory (trace, events, report.json)
        (workdir / "demo_checkpoint.pt").unlink(missing_ok=True)
    sys.stdout.flush()
    render(report, fmt, details=details)
    sys.stderr.write(f"torchdoctor demo: {SCRIPT.name}, evidence and report.json kept in {workdir}; the report "
                     f"with its charts: {workdir / 'run' / 'report.html'}\n")
    return exitcodes.OK

"""`torchdoctor run`: run a training script under probes and diagnose it from measurements.

The flow, one module per step:

1. run_options.py  the command line -> a checked `RunPlan` (usage errors: exit 2)
2. run_process.py  start `python -m torchdoctor.probes.bootstrap SCRIPT ARGS…` in its
                   own process group with the probe configuration in TORCHDOCTOR_RUN;
                   supervise it (timeout, hang watchdog, Ctrl-C, clean-up)
3. analysis/       read the evidence streams, decide how it ended, classify symptoms
4. here            the Report -> diagnosis (route, specialists) -> report.json in the
                   run directory (always) -> the chosen format on stdout -> exit code

A distributed run (`--nproc-per-node N`, or the user's own torchrun line
after `--`; run_launch.py) starts `python -m torch.distributed.run … -m
torchdoctor.probes.bootstrap SCRIPT ARGS…` instead: every rank streams its own
events, the supervisor follows every rank, and how the job ended is decided
from every rank's end (analysis/ranks.py), not from torchrun's exit code. The
cross-rank analysis (analysis/distributed.py) runs for every multi-rank run;
its hang classification (collective-mismatch, ddp-hang, rank-crashed) replaces
the generic per-rank `hang`. The torchdoctor whose node holds rank 0 prints
the report; on other nodes it writes report.json and prints one line.

The parent never imports torch. With `--format json` the script's stdout goes
to our stderr, so stdout carries the report alone.

Exit codes (precedence, first match wins):
130 interrupted (Ctrl-C) > 4 the script failed (exited non-zero, crashed,
killed, --timeout, hang) > 1 a measured symptom at or above
--fail-on > 0. Usage errors exit 2 before anything runs; a torchdoctor bug 70.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from torchdoctor import exitcodes, run_files
from torchdoctor.analysis import RunAnalysis, analyse
from torchdoctor.analysis.evidence import RunEvidence, read_events
from torchdoctor.analysis.outcome import decide
from torchdoctor.clip import clip
from torchdoctor.model import SEVERITY_RANK, Report, RunInfo
from torchdoctor.probes.session import ENV
from torchdoctor.probes.userframes import display_path
from torchdoctor.run_options import RunPlan, RunRequest, UsageError, make_plan
from torchdoctor.run_process import ChildResult, Supervisor
from torchdoctor.stopped import ending


def exit_code(report: Report, fail_on: str) -> int:
    """The documented exit code of a run (see the module docstring for the precedence)."""
    run = report.run
    assert run is not None
    ended = ending(run.stopped).exit  # rules/data/stopped.toml
    if ended == "interrupted":
        return exitcodes.INTERRUPTED
    if ended == "failed":
        return exitcodes.SCRIPT_FAILED
    if fail_on != "never":
        bar = SEVERITY_RANK[fail_on]
        if any(SEVERITY_RANK.get(s.severity, 0) >= bar for s in report.symptoms):
            return exitcodes.FINDINGS
    return exitcodes.OK


def supervise(plan: RunPlan) -> ChildResult:
    env = dict(os.environ)
    env[ENV] = json.dumps(plan.child_config())
    limits = plan.thresholds.get("run", {})
    spread = plan.thresholds.get("distributed", {})
    if plan.distributed:
        if plan.ddp_debug:
            env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        # torchrun's own wait after a signal before it kills its workers (default 30 s)
        env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(int(float(limits.get("terminate_grace_s", 5.0)))))
    stdout = sys.stderr.fileno() if plan.fmt == "json" else None
    return Supervisor(
        argv=plan.child_argv(),
        env=env,
        cwd=plan.child_cwd,
        run_dir=plan.run_dir,
        stdout=stdout,
        timeout_s=plan.timeout_s,
        hang_timeout_s=plan.hang_timeout_s,
        hang_gap_factor=plan.hang_gap_factor,
        startup_s=float(limits.get("startup_timeout_s", 60.0)),
        grace_s=float(limits.get("terminate_grace_s", 5.0)),
        stacks_wait_s=float(limits.get("stacks_wait_s", 2.0)),
        distributed=plan.distributed,
        rank_grace_s=float(spread.get("rank_grace_s", 1.0)),
        peer_wait_s=float(spread.get("peer_wait_s", 3.0)),
        node_settle_s=float(spread.get("node_settle_s", 3.0)) if plan.multinode else 0.0,
        interrupt_grace_s=float(limits.get("interrupt_grace_s", 3.0)),
        settle_s=float(limits.get("leftover_settle_s", 1.0)),
    ).run()


def _drop_empty_files(run_dir: Path) -> None:
    """faulthandler's files exist from the start; keep them only when something was written."""
    for pattern in ("crash.rank*.txt", "stacks.rank*.txt"):
        for path in run_dir.glob(pattern):
            try:
                if path.stat().st_size == 0:
                    path.unlink()
            except OSError:
                pass


def evidence_of(plan: RunPlan, result: ChildResult) -> RunEvidence:
    _drop_empty_files(plan.run_dir)
    events = read_events(plan.run_dir)
    options: dict = {"gpu_memory_gib": plan.gpu_memory_gib} if plan.gpu_memory_gib is not None else {}
    if plan.distributed:
        from torchdoctor.analysis import ranks

        ends = {rank: ranks.rank_end(rank, rows) for rank, rows in events.items() if rows}
        outcome = ranks.decide(result.returncode, result.decided, ends, result.duration_s, result.sent_signal)
        options["distributed"] = {"decided_at": result.decided_at, "peer_failed": result.peer_failed,
                                  **plan.launch.rendezvous()}
    else:
        exit_event = next((e for e in reversed(events.get(0, [])) if e.get("kind") == "exit"), None)
        outcome = decide(result.returncode, result.decided, exit_event, result.duration_s, result.sent_signal)
    outcome.seconds_without_step = result.seconds_without_step
    outcome.hang_timeout_s = result.hang_limit_s or plan.hang_timeout_s
    outcome.timeout_s = plan.timeout_s
    outcome.leftovers = result.leftovers
    outcome.notes += leftover_notes(result.leftovers)
    return RunEvidence(
        run_dir=plan.run_dir,
        cwd=plan.cwd,
        target=plan.display_target,
        project=plan.project,
        probes=plan.probes,
        events=events,
        outcome=outcome,
        thresholds=plan.thresholds,
        options=options,
    )


def leftover_notes(leftovers: list[dict]) -> list[str]:
    """One note for the processes torchdoctor had to end after the script, one for any it could not end."""
    def named(rows: list[dict]) -> str:  # one_line: a `python -c` command line holds newlines
        return "; ".join(f"pid {r['pid']} ({clip(r['command'], 80, one_line=True)}" + (f", {r['ended_by']}" if r["ended_by"] else "")
                         + ")" for r in rows)

    ended = [r for r in leftovers if r["ended_by"]]
    stuck = [r for r in leftovers if not r["ended_by"]]
    notes = []
    if ended:
        notes.append(f"{len(ended)} process{'es' if len(ended) > 1 else ''} of the script outlived it and "
                     f"{'were' if len(ended) > 1 else 'was'} ended by torchdoctor: {named(ended)}.")
    if stuck:
        notes.append(f"{len(stuck)} process{'es' if len(stuck) > 1 else ''} of the script could not be ended "
                     f"and outlive{'' if len(stuck) > 1 else 's'} the run: {named(stuck)}.")
    return notes


def run_info(plan: RunPlan, run: RunEvidence, **measured: Any) -> RunInfo:
    """How the run went (the report's `run`), from the plan and the supervisor's outcome."""
    outcome = run.outcome
    return RunInfo(
        exit_code=outcome.exit_code,
        steps_completed=run.steps_completed(run.ranks[0]),
        stopped=outcome.stopped,
        duration_s=outcome.duration_s,
        command=plan.user_command,
        signal=outcome.signal,
        ranks=max(run.world_size, 1),
        probes=list(plan.probes),
        leftover_processes=list(outcome.leftovers),
        **measured,
    )


def build_report(plan: RunPlan, run: RunEvidence) -> Report:
    from torchdoctor.diagnosis import diagnose

    started = time.perf_counter()
    if plan.notebook is not None:
        plan.notebook.remember_lines()  # the cells' own lines for the locations' `code`
    found = analyse(run)
    if plan.distributed or len(run.ranks) > 1:
        _across_ranks(run, found)
    from torchdoctor.analysis.static import add_static

    add_static(plan, found)  # check's findings on the same script; diagnose() merges them with the measured ones
    if plan.notebook is not None:
        from torchdoctor.notebook import relocate

        relocate(found)  # 'train.ipynb:cell 3', line 4 -> path 'train.ipynb', cell 3, line 4
        found.notes[:0] = plan.notebook.notes()
    outcome = run.outcome
    report = Report(
        command="run",
        target=plan.display_target,
        symptoms=found.symptoms,
        contexts=found.contexts,
        run=run_info(plan, run, measurements=found.measurements, error=found.error),
        environment=found.environment,
        artifacts={"run_dir": display_path(str(plan.run_dir), plan.cwd), **found.artifacts},
        notes=list(dict.fromkeys(found.notes)),  # every rank writes the same probe notes
    )
    diagnose(report, target_hint=plan.script)
    report.artifacts["report"] = display_path(str(plan.run_dir / "report.json"), plan.cwd)
    report.artifacts["report_html"] = display_path(str(plan.run_dir / "report.html"), plan.cwd)
    report.timings = {"run_s": outcome.duration_s, "analysis_s": round(time.perf_counter() - started, 3)}
    first = found.measurements.get("steps", {}).get("first_step_s")
    if first is not None:
        report.timings["first_step_s"] = first
    return report


def _across_ranks(run: RunEvidence, found: RunAnalysis) -> None:
    """The cross-rank analysis joins every multi-rank run; it names the error and the hang."""
    from torchdoctor.analysis import distributed

    if "distributed" not in run.probes:
        found.absorb("distributed", distributed.analyse(run))
    waiting = distributed.rendezvous_wait(run)
    if waiting is not None:  # no rank ever started: not a script's hang
        found.symptoms = [s for s in found.symptoms if s.id != "hang"] + [waiting]
    found.error = distributed.first_error(run) or found.error
    classified = {"collective-mismatch", "ddp-hang", "rank-crashed"}
    if run.outcome.stopped == "hang" and any(s.id in classified for s in found.symptoms):
        found.symptoms = [s for s in found.symptoms if s.id != "hang"]


def write_report(report: Report, run_dir: Path, events: dict[int, list[dict[str, Any]]] | None = None) -> None:
    from torchdoctor.render import to_json

    tmp = run_dir / f"report.json.{os.getpid()}.tmp"
    tmp.write_text(to_json(report) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / "report.json")
    write_html(report, run_dir, events)


def write_html(report: Report, run_dir: Path, events: dict[int, list[dict[str, Any]]] | None = None) -> None:
    """report.html next to report.json (render/html_page.py), then the manifest of every file the run wrote.

    `events`: the run's evidence as the analysis read it (read again from run_dir when None). A failure here
    costs the page only: report.json is already written, and the run's exit code stands.
    """
    try:
        from torchdoctor.render.html_page import page

        text = page(report, run_dir, events=events)
        tmp = run_dir / f"report.html.{os.getpid()}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, run_dir / "report.html")
    except Exception as exc:  # noqa: BLE001 - the page is a view of report.json, never a reason to fail the run
        if os.environ.get("TORCHDOCTOR_DEBUG"):
            raise
        sys.stderr.write(f"torchdoctor: could not write report.html ({type(exc).__name__}: {exc}); "
                         "report.json has the whole report\n")
    run_files.record(run_dir)  # what this run wrote, so that the next run into run_dir may replace it


def run_command(req: RunRequest) -> int:
    try:
        plan = make_plan(req)
    except UsageError as exc:
        sys.stderr.write(f"torchdoctor: {exc}\n")
        return exitcodes.USAGE
    probes = ", ".join(plan.probes) or "no probes"
    sys.stderr.write(
        f"torchdoctor: running {plan.display_target} under {probes}; evidence in "
        f"{display_path(str(plan.run_dir), plan.cwd)}\n"
    )
    sys.stderr.flush()
    result = supervise(plan)
    run = evidence_of(plan, result)
    try:
        report = build_report(plan, run)
    except Exception as exc:
        if os.environ.get("TORCHDOCTOR_DEBUG"):
            raise
        report = _fallback_report(plan, run, exc)
        write_report(report, plan.run_dir)
        sys.stderr.write(f"torchdoctor: internal error while diagnosing: {type(exc).__name__}: {exc}\n")
        return exitcodes.INTERNAL
    write_report(report, plan.run_dir, run.events)
    from torchdoctor.render import render

    sys.stdout.flush()
    if plan.distributed and run.events and 0 not in run.events:
        ranks = ("rank " if len(run.ranks) == 1 else "ranks ") + ", ".join(str(r) for r in run.ranks)
        sys.stderr.write(f"torchdoctor: {ranks} on this node: report in "
                         f"{display_path(str(plan.run_dir / 'report.json'), plan.cwd)} (rank 0's node prints the "
                         "whole report)\n")
    else:
        render(report, plan.fmt, details=plan.details)
    return exit_code(report, plan.fail_on)


def _fallback_report(plan: RunPlan, run: RunEvidence, exc: Exception) -> Report:
    """The run's facts without a diagnosis: report.json exists even when torchdoctor has a bug."""
    return Report(
        command="run",
        target=plan.display_target,
        run=run_info(plan, run),
        artifacts={"run_dir": display_path(str(plan.run_dir), plan.cwd)},
        notes=[f"torchdoctor failed to diagnose this run ({type(exc).__name__}: {exc}); the evidence is in the run "
               "directory. Please report it (set TORCHDOCTOR_DEBUG=1 for the traceback)."],
    )

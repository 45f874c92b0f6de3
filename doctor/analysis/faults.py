"""How the script failed: its exception, a fatal signal, a hang, a timeout, a kill.

- An uncaught exception (the bootstrap's `exception` event) becomes the
  report's `run.error` (type, message, the user's deepest frame) and goes
  through the triage desk's error signatures (`torchdoctor.triage.read_errors`)
  — so a RuntimeError raised by the script gets the same symptoms as the same
  traceback pasted into `torchdoctor ask`, located at the user's line.
- A fatal signal (SIGSEGV, SIGABRT, …): faulthandler's dump in
  `crash.rank<R>.txt` -> `native-crash` at the main thread's deepest user frame.
- A hang (no training activity for --hang-timeout seconds): the runner sent
  SIGUSR1 and faulthandler wrote every thread's stack to
  `stacks.rank<R>.txt` -> `hang` at the main thread's deepest user frame.
- A timeout: the same stacks, as a note (the limit was the user's).
- Probe notes, probe errors and artifacts named by probes pass through.
"""

from __future__ import annotations

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.stacks import Dump, Thread, format_thread, parse
from torchdoctor.model import Evidence, Location, RunError, Symptom
from torchdoctor.probes.userframes import display_path, is_user_file

KIND = "faults"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    for rank in run.ranks:
        for stem in ("events", "steps"):  # the evidence stream and the per-step records (probes/stepfile.py)
            path = run.file(stem, ".jsonl", rank)
            if path.exists():
                out.artifacts[stem if rank == 0 else f"{stem}.rank{rank}"] = display_path(str(path), run.cwd)
        _exception(run, rank, out)
    stopped = run.outcome.stopped
    if stopped == "crashed" and run.outcome.signal:
        _fatal_signal(run, out)
    if stopped in ("hang", "timeout"):
        _stuck(run, out)
    if stopped == "killed":
        out.notes.append(
            f"The script was killed by {run.outcome.signal or 'a signal'} from outside after "
            f"{run.steps_completed()} optimizer steps (the kernel's OOM killer sends SIGKILL); "
            "everything measured until then is in this report."
        )
    if not any(run.start(r) for r in run.ranks):
        out.notes.append("The bootstrap never started in the script's process: nothing was measured.")
    for event in run.of_kind("note"):
        out.notes.append(event.get("text", ""))
    for rank in run.ranks:
        out.symptoms += [_probe_failed(run, event, rank) for event in run.of_kind("probe-error", rank=rank)]
    for event in run.of_kind("artifact"):
        if event.get("name") and event.get("path"):
            out.artifacts[event["name"]] = display_path(event["path"], run.cwd)
    out.notes += run.outcome.notes
    return out


def _probe_failed(run: RunEvidence, event: dict, rank: int) -> Symptom:
    """A probe's own failure is a finding about the report: what it measures is unknown from then on."""
    probe, step = event.get("probe") or "a", event.get("step")
    when = f"at step {step}" if isinstance(step, int) else "before the first step"
    return run.symptom(
        "probe-failed",
        probe=str(probe),
        summary=f"the {probe} probe failed in {event.get('where')} {when} and was switched off: "
                f"{event.get('error')}",
        values={"probe": str(probe), "where": str(event.get("where")), "error": str(event.get("error"))[:300],
                **({"at": event["at"]} if isinstance(event.get("at"), str) else {}),
                **({"step": step} if isinstance(step, int) else {})},
        step=step if isinstance(step, int) else None,
        rank=rank,
    )


def _exception(run: RunEvidence, rank: int, out: Analysis) -> None:
    events = run.of_kind("exception", rank=rank)
    if not events:
        return
    from torchdoctor.triage import read_errors

    event = events[-1]
    frame = event.get("user_frame") or {}
    where = run.location(frame["path"], frame.get("line"), frame.get("function")) if frame.get("path") else None
    step = event.get("step")
    if out.error is None:
        out.error = RunError(type=event.get("type", "Exception"), message=event.get("message", ""),
                             location=where, step=step)
    symptoms, contexts, _ = read_errors(event.get("traceback") or f"{event.get('type')}: {event.get('message')}")
    for symptom in symptoms:
        symptom.location = symptom.location or where
        symptom.step = step
        symptom.rank = run.rank_of(rank)
        for ev in symptom.evidence:
            ev.location = ev.location or where
    out.symptoms += symptoms
    out.contexts += [c for c in contexts if c not in out.contexts]


def _user_frame(run: RunEvidence, thread: Thread) -> tuple[str, int, str] | None:
    for frame in thread.frames:  # innermost first
        if is_user_file(frame[0], run.project):
            return frame
    for frame in thread.frames:
        if is_user_file(frame[0]):
            return frame
    return None


def _read_dump(run: RunEvidence, stem: str, rank: int) -> tuple[Dump | None, str | None]:
    path = run.file(stem, ".txt", rank)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, None
    return parse(text), display_path(str(path), run.cwd)


def _main_thread(run: RunEvidence, dump: Dump, rank: int) -> Thread | None:
    start = run.start(rank) or {}
    return dump.main(start.get("main_thread"))


def _fatal_signal(run: RunEvidence, out: Analysis) -> None:
    for rank in run.ranks:
        dump, shown = _read_dump(run, "crash", rank)
        if dump is not None:
            out.artifacts["crash_stacks" if rank == 0 else f"crash_stacks.rank{rank}"] = shown or ""
        elif rank != 0:
            continue
        thread = None
        if dump is not None:
            thread = next((t for t in dump.threads if t.current), None) or _main_thread(run, dump, rank)
        frame = _user_frame(run, thread) if thread is not None else None
        where = run.location(frame[0], frame[1], frame[2]) if frame else None
        what = f" ({dump.fatal})" if dump and dump.fatal else ""
        out.symptoms.append(
            run.symptom(
                "native-crash",
                probe=KIND,
                summary=f"The process died of {run.outcome.signal}{what} after {run.steps_completed(rank)} "
                f"optimizer steps" + (f", in {_at(where)}" if where else ""),
                values={"signal": run.outcome.signal, "fatal_error": dump.fatal if dump else None,
                        "step": run.steps_completed(rank)},
                location=where,
                step=run.steps_completed(rank),
                rank=rank,
                quote=format_thread(thread) if thread else None,
            )
        )


def _stuck(run: RunEvidence, out: Analysis) -> None:
    outcome = run.outcome
    for rank in run.ranks:
        dump, shown = _read_dump(run, "stacks", rank)
        if shown and dump is not None:
            out.artifacts["stacks" if rank == 0 else f"stacks.rank{rank}"] = shown
        thread = _main_thread(run, dump, rank) if dump else None
        frame = _user_frame(run, thread) if thread else None
        where = run.location(frame[0], frame[1], frame[2]) if frame else None
        steps = run.steps_completed(rank)
        if outcome.stopped == "timeout":
            at = f" The main thread was at {_at(where)}." if where else ""
            out.notes.append(f"Stopped by --timeout ({outcome.timeout_s:g} s) after {steps} optimizer steps.{at}")
            continue
        waited = outcome.seconds_without_step or outcome.hang_timeout_s or 0.0
        since = f"after step {steps}" if steps else "since the start (no step had completed)"
        summary = f"No training activity (optimizer step, forward, backward or output) for {waited:.1f} s {since}"
        if where:
            summary += f"; the main thread was at {_at(where)}"
        elif dump is None:
            summary += "; no stack dump could be taken"
        others = [t for t in (dump.threads if dump else []) if t is not thread]
        values = {
            "hang_timeout_s": outcome.hang_timeout_s,
            "seconds_without_step": round(waited, 2),
            "steps_completed": steps,
            "before_first_step": steps == 0,
            "threads": len(dump.threads) if dump else None,
        }
        if frame:
            values["function"] = frame[2]
        extra = [
            Evidence(kind="probe", summary=f"another thread was at {_at(loc)}", source=KIND, location=loc)
            for loc in (_thread_location(run, t) for t in others)
            if loc is not None
        ][:4]
        out.symptoms.append(
            run.symptom(
                "hang",
                probe=KIND,
                summary=summary,
                values=values,
                location=where,
                step=steps,
                rank=rank,
                quote=format_thread(thread) if thread else None,
                evidence=extra,
            )
        )


def _thread_location(run: RunEvidence, thread: Thread) -> Location | None:
    frame = _user_frame(run, thread)
    return run.location(frame[0], frame[1], frame[2]) if frame else None


def _at(where: Location | None) -> str:
    if where is None:
        return "an unknown place"
    text = f"{where.path}:{where.line}"
    if where.code:
        text += f" (`{where.code}`)"
    return text

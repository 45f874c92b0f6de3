"""How did the script end? From the child's status, the runner's own decision and the exit event.

`stopped` (RunInfo.stopped):

- completed   the script returned or called sys.exit (exit_code says how)
- steps       --steps N was reached and the script was stopped on purpose
- timeout     --timeout expired
- hang        no optimizer step for --hang-timeout seconds
- crashed     an uncaught exception, or a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL)
- killed      ended by a signal from outside (SIGKILL — e.g. the kernel's OOM killer — or SIGTERM)
- interrupted Ctrl-C (or SIGTERM/SIGHUP to torchdoctor itself)

A process that dies of a signal after the bootstrap recorded a normal end
(the script had finished; something failed at interpreter exit) keeps the
script's outcome and gets a note.
"""

from __future__ import annotations

import signal as signals
from typing import Any

from torchdoctor.analysis.evidence import Outcome

FATAL = {"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGSYS", "SIGTRAP"}
_BY_REASON = {
    "steps": "steps",
    "completed": "completed",
    "exit": "completed",
    "exception": "crashed",
    "interrupted": "interrupted",
    "terminated": "killed",
}


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def decide(
    returncode: int | None,
    decided: str | None,
    exit_event: dict[str, Any] | None,
    duration_s: float,
    sent_signal: str | None = None,
) -> Outcome:
    died_of = signal_name(-returncode) if returncode is not None and returncode < 0 else None
    exit_code = returncode if returncode is not None and returncode >= 0 else None
    reason = exit_event.get("reason") if exit_event else None
    notes: list[str] = []

    if decided in ("hang", "timeout", "interrupted"):
        return Outcome(decided, exit_code, sent_signal or died_of, round(duration_s, 3), notes=notes)

    if reason in _BY_REASON:
        stopped = _BY_REASON[reason]
        recorded = exit_event.get("code") if exit_event else None
        if died_of and stopped in ("steps", "completed"):
            notes.append(
                f"The process died of {died_of} after the script had finished ({reason}): the failure is in "
                "interpreter shutdown (atexit handlers, library teardown), not in training."
            )
            return Outcome(stopped, recorded if isinstance(recorded, int) else 0, died_of, round(duration_s, 3),
                           notes=notes)
        sig = "SIGTERM" if reason == "terminated" else died_of
        return Outcome(stopped, exit_code, sig, round(duration_s, 3), notes=notes)

    if died_of:
        stopped = "crashed" if died_of in FATAL else "killed"
        return Outcome(stopped, None, died_of, round(duration_s, 3), notes=notes)
    if exit_code not in (0, None):
        notes.append("The script's process ended without the bootstrap recording how; see its output above.")
        return Outcome("crashed", exit_code, None, round(duration_s, 3), notes=notes)
    return Outcome("completed", exit_code, None, round(duration_s, 3), notes=notes)

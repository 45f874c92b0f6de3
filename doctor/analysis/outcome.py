"""How did the script end? From the child's status, the runner's own decision and the exit event.

`stopped` (RunInfo.stopped) is one of the values of rules/data/stopped.toml
(doctor/stopped.py): completed (exit 0), steps, exited (a non-zero exit code
the script chose: sys.exit(n), os._exit(n)), crashed (an uncaught exception,
a fatal signal), killed, timeout, hang, interrupted. Every decision below goes
through `_ended`, which refuses any other value.

A process that dies of a signal after the bootstrap recorded a normal end
(the script had finished; something failed at interpreter exit) keeps the
script's outcome and gets a note.
"""

from __future__ import annotations

import signal as signals
from typing import Any

from torchdoctor.analysis.evidence import Outcome
from torchdoctor.stopped import ending

FATAL = {"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGSYS", "SIGTRAP"}
_BY_REASON = {
    "steps": "steps",
    "completed": "completed",
    "exit": "completed",  # sys.exit(0); sys.exit(n), n != 0: exited (below)
    "exception": "crashed",
    "interrupted": "interrupted",
    "terminated": "killed",
}


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _ended(stopped: str, exit_code: int | None, sig: str | None, duration_s: float, notes: list[str]) -> Outcome:
    ending(stopped)  # a value stopped.toml does not define is a bug here, not a report
    return Outcome(stopped, exit_code, sig, round(duration_s, 3), notes=notes)


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
        return _ended(decided, exit_code, sent_signal or died_of, duration_s, notes)

    if reason in _BY_REASON:
        stopped = _BY_REASON[reason]
        recorded = exit_event.get("code") if exit_event else None
        if reason == "exit" and recorded not in (0, None):
            stopped = "exited"
        if died_of and stopped in ("steps", "completed", "exited"):
            notes.append(
                f"The process died of {died_of} after the script had finished ({reason}): the failure is in "
                "interpreter shutdown (atexit handlers, library teardown), not in training."
            )
            return _ended(stopped, recorded if isinstance(recorded, int) else 0, died_of, duration_s, notes)
        sig = "SIGTERM" if reason == "terminated" else died_of
        return _ended(stopped, exit_code, sig, duration_s, notes)

    if died_of:
        return _ended("crashed" if died_of in FATAL else "killed", None, died_of, duration_s, notes)
    if exit_code not in (0, None):  # os._exit(n), or exit(n) from native code: the script's process chose it
        notes.append("The script's process exited without the bootstrap recording how (os._exit, or exit() from "
                     "native code); see its output above.")
        return _ended("exited", exit_code, None, duration_s, notes)
    return _ended("completed", exit_code, None, duration_s, notes)

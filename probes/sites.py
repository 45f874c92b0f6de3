"""The user's line as evidence: `{"path", "line", "function"}` of the innermost frame that is the user's."""

from __future__ import annotations

import sys
from typing import Any

from torchdoctor.probes.patches import outside_own_init, user_site
from torchdoctor.probes.userframes import is_library_file

# A user function no longer than this (its `def` line to its last line) that bears the name of the torch call it
# makes, and makes none of the other calls of a training step, is a pass-through wrapper of that call (an optimizer
# wrapper's zero_grad(), a scheduler wrapper's step(), a trainer's backward(loss) that also clips): the line a user
# changes is where the wrapper is called. A trainer's step(batch) calls backward: it trains, it wraps nothing.
# It calls `name` once: a step() that steps the optimizer and the scheduler orders them, and that order is the line.
WRAPPER_MAX_LINES = 10
TRAINING_CALLS = frozenset({"backward", "step", "zero_grad"})
_WRAPPERS: dict[tuple[Any, str], bool] = {}
__all__ = ["above_wrappers", "as_dict", "call_site", "here", "outside_own_init", "user_stack"]


def here(start: Any = None) -> dict[str, Any] | None:
    """The user's frame around the caller (library, torch and torchdoctor frames skipped), as a dict."""
    return as_dict(user_site(start or sys._getframe(1)))


def as_dict(site: tuple[str, int, str] | None) -> dict[str, Any] | None:
    if site is None:
        return None
    return {"path": site[0], "line": site[1], "function": site[2]}


def call_site(name: str, start: Any = None) -> dict[str, Any] | None:
    """`here()`, but above the user's thin wrappers of the torch call `name` (see WRAPPER_MAX_LINES): the line
    that called the wrapper. A longer function of that name (a trainer's step(batch) that trains) is the line."""
    return as_dict(user_site(above_wrappers(name, start or sys._getframe(1))))


def above_wrappers(name: str, frame: Any) -> Any:
    """The innermost user frame from `frame` outwards, or, when that is a thin wrapper named `name`, its caller's."""
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    for _ in range(4):  # wrappers of wrappers, bounded
        if frame is None:
            break
        code, back = frame.f_code, frame.f_back
        if back is None or is_library_file(back.f_code.co_filename) or not _thin_wrapper(code, name):
            break
        frame = back
    return frame


def _thin_wrapper(code: Any, name: str) -> bool:
    """Whether a function is a thin wrapper of the torch call `name` (see WRAPPER_MAX_LINES; cached per code)."""
    key = (code, name)
    found = _WRAPPERS.get(key)
    if found is None:
        lines = [line for _, _, line in code.co_lines() if line is not None]
        span = (max(lines) - code.co_firstlineno + 1) if lines else 0
        found = (code.co_name.lstrip("_") == name and span <= WRAPPER_MAX_LINES
                 and not (TRAINING_CALLS - {name}) & set(code.co_names) and _calls_of(code, name) == 1)
        if len(_WRAPPERS) < 1024:
            _WRAPPERS[key] = found
    return found


def _calls_of(code: Any, name: str) -> int:
    """How many times a function's code reads the attribute `name` (its `.step(` calls): a wrapper makes one; one
    that steps the optimizer and the scheduler (jiant's OptimizerScheduler.step) orders two, and that order is the
    line."""
    import dis

    return sum(1 for ins in dis.get_instructions(code)
               if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == name)


def user_stack(frame: Any, limit: int = 24) -> list[tuple[int, Any, int]]:
    """The user's frames from `frame` outwards, outermost first, as (id(frame), code object, current line): kept
    (not the frames) to find, later, the frame a second stack shares with this one."""
    out = []
    while frame is not None and len(out) < limit:
        if not is_library_file(frame.f_code.co_filename):
            out.append((id(frame), frame.f_code, frame.f_lineno))
        frame = frame.f_back
    out.reverse()
    return out

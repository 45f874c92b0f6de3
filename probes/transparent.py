"""Warnings raised under the probes' wrappers keep the user's line, as under plain Python.

A wrapper around a torch function is one more Python frame between the
user's call and torch. Torch points its warnings at its caller with
`warnings.warn(…, stacklevel=2)`; under a wrapper that caller is the
wrapper, so `scheduler.step()`'s "Detected call of `lr_scheduler.step()`
before `optimizer.step()`" would name probes/schedule.py instead of the
user's line. No wrapper can avoid its frame (bookkeeping after the call
needs one), so the frames are made invisible to warnings instead: every
wrapper registers its code with `transparent(fn)` and, at the first
registration, two functions of the `warnings` module are replaced:

- `warnings.warn` counts `stacklevel` without the registered frames. The
  warning is then filtered (`module=` filters), de-duplicated (the user
  module's `__warningregistry__`) and shown exactly as without torchdoctor;
- `warnings._showwarnmsg` (which shows or records every warning, C ones
  included) moves a warning that still names a registered frame to the
  first frame above it that is not a wrapper's. Only C code called
  directly by a wrapper gets there (`PyErr_WarnEx` takes the innermost
  Python frame: the wrapper's); for those, filters and the once-per-line
  registry still see the wrapper's module.

Cost: nothing per wrapped call; a frame walk per warning raised.
"""

from __future__ import annotations

import operator
import sys
import warnings
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_HIDDEN: set[CodeType] = set()
_FILES: set[str] = set()
_original_warn: Callable[..., Any] | None = None
_original_show: Callable[..., Any] | None = None


def transparent(fn: F) -> F:
    """Register a wrapper: warnings raised below it name its caller's line, never the wrapper's."""
    code = getattr(fn, "__code__", None)
    if isinstance(code, CodeType):
        _HIDDEN.add(code)
        _FILES.add(code.co_filename)
        _install()
    return fn


def _install() -> None:
    global _original_warn, _original_show
    if _original_warn is not None:
        return
    _original_warn = warnings.warn
    _original_show = warnings._showwarnmsg  # type: ignore[attr-defined]
    warnings.warn = warn
    warnings._showwarnmsg = _showwarnmsg  # type: ignore[attr-defined]


def warn(message: Any, category: Any = None, stacklevel: Any = 1, source: Any = None, **kwargs: Any) -> None:
    """`warnings.warn`, with `stacklevel` counted as if the registered wrappers were not on the stack."""
    assert _original_warn is not None
    try:
        level = operator.index(stacklevel)
    except TypeError:  # the original raises its own error for it
        level = None
    if level is not None:
        # +1: this function's own frame sits between the caller and the original.
        stacklevel = _without_wrappers(sys._getframe(1), level) + 1
    _original_warn(message, category, stacklevel, source, **kwargs)


def _without_wrappers(caller: FrameType, stacklevel: int) -> int:
    """`stacklevel` counted from `caller` (level 1) plus the wrapper frames below the frame it names."""
    frame: FrameType | None = caller
    level, skipped = 1, 0
    while frame is not None:
        if frame.f_code in _HIDDEN:
            skipped += 1
        elif level >= stacklevel:
            break
        else:
            level += 1
        frame = frame.f_back
    return stacklevel + skipped


def _showwarnmsg(msg: Any) -> None:
    assert _original_show is not None
    if getattr(msg, "filename", None) in _FILES:
        try:
            _move_to_caller(msg)
        except Exception:  # noqa: BLE001 - a warning is never lost to our bookkeeping
            pass
    _original_show(msg)


def _move_to_caller(msg: Any) -> None:
    """A warning that names a wrapper's line (raised by C code the wrapper called) -> the line that called it."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and not (frame.f_code in _HIDDEN and frame.f_code.co_filename == msg.filename
                                     and frame.f_lineno == msg.lineno):
        frame = frame.f_back
    while frame is not None and frame.f_code in _HIDDEN:
        frame = frame.f_back
    if frame is not None:
        msg.filename, msg.lineno, msg.line = frame.f_code.co_filename, frame.f_lineno, None

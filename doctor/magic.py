"""`%load_ext torchdoctor`, then `%%torchdoctor` on a cell: the cell's training under the probes.

    %%torchdoctor --steps 50
    for batch in loader:
        ...

The cell runs as IPython runs any cell (magics, display of its last value),
inside a `torchdoctor.watch()` session (doctor/watching.py); its Report is
the cell's output — HTML in Jupyter, a one-line summary in a terminal — and
stays in the variable `_torchdoctor` (`_torchdoctor.report()`,
`_torchdoctor.write("report.html")`). Options: --steps N, --probe NAMES
(repeatable or comma-separated), --out DIR, --print (the text report too).

`--steps N` ends the cell after N optimizer steps without a traceback. An
exception of the cell is diagnosed, then raised again: IPython shows it and
the cell fails, as without the magic (the report is in `_torchdoctor`).

IPython is not a dependency: this module is imported only by
`load_ext torchdoctor` (torchdoctor.load_ipython_extension).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from torchdoctor.watching import Watch


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgumentError(message)


def _parser() -> _Parser:
    parser = _Parser(prog="%%torchdoctor", add_help=False)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--probe", action="append", default=[])
    parser.add_argument("--out")
    parser.add_argument("--print", action="store_true", dest="show")
    return parser


def torchdoctor_cell(ipython: Any, line: str, cell: str) -> Watch | None:
    """Run `cell` under a watch() session; return the session (its Report displays as the cell's output)."""
    from torchdoctor.probes.session import StopRun

    try:
        options = _parser().parse_args(shlex.split(line))
    except (_ArgumentError, ValueError) as exc:
        print(f"%%torchdoctor: {exc} (options: --steps N, --probe NAMES, --out DIR, --print)")
        return None
    watch = Watch(steps=options.steps, probes=options.probe, out=options.out, show=options.show,
                  label="%%torchdoctor cell", where=("<ipython cell>", 1))
    try:
        watch.start()
    except (ValueError, RuntimeError) as exc:
        print(f"%%torchdoctor: {exc}")
        return None
    saved = (ipython.custom_exceptions, ipython.CustomTB)
    # Nothing is shown from inside: --steps N ends the cell with StopRun (no traceback at all), and the cell's
    # own exception is raised again below, once diagnosed, so that IPython shows it once and marks the cell
    # as failed (Jupyter's "Run All" stops there, as without the magic).
    ipython.set_custom_exc((Exception, StopRun), lambda shell, etype, value, tb, tb_offset=None: None)
    try:
        result = ipython.run_cell(cell, store_history=False)
    finally:
        ipython.custom_exceptions, ipython.CustomTB = saved
    error = result.error_in_exec
    if error is None:
        watch.stop("completed", 0)
    elif isinstance(error, StopRun):
        watch.stop("steps", 0)
    elif isinstance(error, KeyboardInterrupt):
        watch.stop("interrupted", 130)
    else:
        session = watch._session
        if session is not None:
            session.record_exception(error)
            session.notify_exception(error)
        watch.stop("exception", 1)
    ipython.user_ns["_torchdoctor"] = watch
    if error is not None and not isinstance(error, (StopRun, KeyboardInterrupt)):
        raise error
    return watch


def register(ipython: Any) -> None:
    """Register the `%%torchdoctor` cell magic with this IPython."""

    def magic(line: str, cell: str) -> Watch | None:
        return torchdoctor_cell(ipython, line, cell)

    magic.__doc__ = __doc__
    ipython.register_magic_function(magic, magic_kind="cell", magic_name="torchdoctor")

"""How a run ended: the values of `run.stopped`, from rules/data/stopped.toml (one place).

Who uses them: analysis/outcome.py and analysis/ranks.py decide the value,
render/run_summary.py prints its phrase, runner.exit_code maps it to the
exit code; tests hold the report schema's enum and docs/run.md's table to
the same list. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Ending:
    value: str
    meaning: str  # for docs/run.md
    says: str  # "The script <says>: …"
    exit: str  # ok | failed | interrupted
    style: str  # ok | warning | error


@cache
def endings() -> dict[str, Ending]:
    """value -> its row, in the table's order."""
    from torchdoctor.rules import catalog

    return {value: Ending(value=value, **row) for value, row in catalog.load_toml("stopped.toml").items()}


def ending(value: str) -> Ending:
    """The row of a value; KeyError for a value the table does not define (a bug: every decision uses it)."""
    return endings()[value]


def failed(value: str) -> bool:
    """Did the script fail (exit code 4)?"""
    return ending(value).exit == "failed"

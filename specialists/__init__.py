"""The eight specialists, one module each, in the routing table's order.

Each module defines `SPECIALIST`, a `Specialist` whose handlers turn the
symptoms routed to it (with their evidence) into one `FixReport`.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module

from torchdoctor.model import FixReport, Symptom

MODULES = {
    "memory": "memory",
    "module-design": "module_design",
    "distributed": "distributed",
    "mixed-precision": "mixed_precision",
    "profiling": "profiling",
    "debugging": "debugging",
    "checkpointing": "checkpointing",
    "autograd": "autograd",
}


def get(specialist_id: str):
    """The `Specialist` object for an id (imports its module on first use)."""
    return import_module(f"torchdoctor.specialists.{MODULES[specialist_id]}").SPECIALIST


def consult(
    specialist_id: str,
    symptoms: list[Symptom],
    contexts: Iterable[str] = (),
    command: str = "ask",
    target: str | None = None,
) -> FixReport:
    return get(specialist_id).consult(symptoms, contexts=contexts, command=command, target=target)

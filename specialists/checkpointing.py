"""Specialist: checkpointing (placeholder until its handlers are written)."""

from __future__ import annotations

from torchdoctor.specialists.base import Advice, Case, Specialist

SPECIALIST = Specialist("checkpointing")


@SPECIALIST.general
def general(case: Case) -> Advice:
    return Advice(f"{case.symptom.title}.", [], [])

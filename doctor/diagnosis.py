"""The shared tail of every door: merge symptoms, route them, consult specialists."""

from __future__ import annotations

import os
from collections.abc import Iterable

from torchdoctor.model import Report, Symptom
from torchdoctor.router import route
from torchdoctor.rules.evidence import CHECK_ENV


def merge_symptoms(symptoms: Iterable[Symptom]) -> list[Symptom]:
    """One symptom per (id, rank): evidence from several doors is combined.

    A mistake seen by `check` (a line) and by a probe (numbers) is one symptom
    with both kinds of evidence, not two.
    """
    merged: dict[tuple[str, int | None], Symptom] = {}
    for s in symptoms:
        key = (s.id, s.rank)
        kept = merged.get(key)
        if kept is None:
            merged[key] = s
            continue
        kept.evidence.extend(s.evidence)
        kept.confidence = max(kept.confidence, s.confidence)
        if kept.location is None:
            kept.location = s.location
        if kept.step is None:
            kept.step = s.step
        if _rank(s.severity) > _rank(kept.severity):
            kept.severity = s.severity
    return list(merged.values())


def _rank(severity: str) -> int:
    from torchdoctor.model import SEVERITY_RANK

    return SEVERITY_RANK.get(severity, 0)


def diagnose(report: Report, target_hint: str | None = None) -> Report:
    """Fill `route` and `reports` of a report whose symptoms are known."""
    from torchdoctor.specialists import consult

    report.symptoms = merge_symptoms(report.symptoms)
    report.route = route(report.symptoms, report.contexts)
    by_id = {s.id: s for s in report.symptoms}
    report.reports = [
        consult(
            step.specialist,
            [by_id[i] for i in step.symptoms if i in by_id],
            contexts=report.contexts,
            command=report.command,
            target=target_hint or report.target,
        )
        for step in report.route
    ]
    if os.environ.get(CHECK_ENV):
        _check(report)
    return report


def _check(report: Report) -> None:
    """Debug mode: fail on evidence the registry does not declare, and on a report that contradicts itself."""
    from torchdoctor.consistency import contradictions
    from torchdoctor.rules.evidence import EvidenceError, report_problems

    problems = report_problems(report.symptoms) + [str(c) for c in contradictions(report.to_dict())]
    if problems:
        raise EvidenceError(f"{CHECK_ENV}: " + "; ".join(problems))

"""The router: symptoms (+ contexts) -> an ordered route of specialists.

It applies the routing table of `rules/data/routing.toml`: the first
precedence row whose condition holds leads the route (diagnosis before
prescription); every other specialist follows from each symptom's catalogue
route, strongest symptom first.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchdoctor.model import SEVERITY_RANK, RouteStep, Symptom
from torchdoctor.rules import catalog

STRONG_MARGIN = 0.25  # a symptom within this of the most confident one counts as strong
SEVERITY_WEIGHT = 0.04  # one severity level weighs less than one rank within a signature (0.05)


def matching_row(symptom_ids: Iterable[str], contexts: Iterable[str]) -> dict | None:
    """The first precedence row whose condition holds, or None."""
    ids = set(symptom_ids)
    ctx = set(contexts)
    for row in catalog.routing()["precedence"]:
        if not ids.intersection(row["symptoms"]):
            continue
        if row.get("contexts") and not ctx.intersection(row["contexts"]):
            continue
        return row
    return None


def route(symptoms: list[Symptom], contexts: Iterable[str] = ()) -> list[RouteStep]:
    contexts = set(contexts)
    # The surest and most severe first: severity breaks near-ties of confidence
    # (a rule's error before its warning) without letting a weakly matched
    # error word outrank what the user plainly described. Stable: ties keep
    # the order in which the doors found them.
    ordered = sorted(symptoms, key=lambda s: -(s.confidence + SEVERITY_WEIGHT * SEVERITY_RANK.get(s.severity, 0)))
    steps: dict[str, RouteStep] = {}

    # Only the strongest symptoms may pick the leading row: a weak secondary
    # match (a word in a pasted log) or a mere warning next to an error must
    # not put its specialist first.
    lead = ordered[0] if ordered else None
    strong = [
        s.id
        for s in ordered
        if lead is not None and s.severity == lead.severity and s.confidence >= lead.confidence - STRONG_MARGIN
    ]
    row = matching_row(strong, contexts)
    if row is not None:
        row_symptoms = [s.id for s in ordered if s.id in row["symptoms"]]
        for position, specialist in enumerate(row["order"]):
            if position == 0:
                why = f"{row['label']} -> {specialist} first: {row['why']}"
            else:
                why = f"{row['label']} -> then {specialist}, once {row['order'][position - 1]} has narrowed the cause."
            steps[specialist] = RouteStep(
                specialist=specialist,
                why=why,
                symptoms=list(row_symptoms),
                row=row["id"],
            )

    for s in ordered:
        info = catalog.symptom(s.id)
        for specialist in info.route:
            step = steps.get(specialist)
            if step is None:
                steps[specialist] = RouteStep(
                    specialist=specialist,
                    why=f"{s.id} ({info.title}) is routed to {specialist} by the symptom catalogue.",
                    symptoms=[s.id],
                    row=None,
                )
            elif s.id not in step.symptoms:
                step.symptoms.append(s.id)

    if steps:
        problems = [s.id for s in ordered]
        for ctx in catalog.routing().get("context", []):
            follow = ctx.get("follow")
            if ctx["id"] in contexts and follow and follow not in steps:
                steps[follow] = RouteStep(
                    specialist=follow,
                    why=f"The setup involves {ctx['label']}: {follow} checks that side once the symptoms are handled.",
                    symptoms=problems[:1],
                    row=f"context:{ctx['id']}",
                )
    return list(steps.values())

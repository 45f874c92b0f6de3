"""The router: symptoms (+ contexts) -> an ordered route of specialists.

It applies the routing table of `rules/data/routing.toml`: the first
precedence row whose condition holds leads the route (diagnosis before
prescription); every other specialist follows from each symptom's catalogue
route, strongest symptom first.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchdoctor.model import RouteStep, Symptom
from torchdoctor.rules import catalog

STRONG_MARGIN = 0.25  # a symptom within this of the most confident one counts as strong


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
    ordered = sorted(symptoms, key=lambda s: -s.confidence)  # stable: ties keep discovery order
    steps: dict[str, RouteStep] = {}

    # Only the strongest symptoms may pick the leading row: a weak secondary
    # match (a word in a pasted log) must not put its specialist first.
    top = ordered[0].confidence if ordered else 0.0
    row = matching_row([s.id for s in ordered if s.confidence >= top - STRONG_MARGIN], contexts)
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

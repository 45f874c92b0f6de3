"""Every example query and every routing-mistake row of the routing table, as a test."""

from __future__ import annotations

import pytest

from torchdoctor.ask import build_report
from torchdoctor.rules import catalog

TABLE = catalog.routing()
EXAMPLES = [(spec["id"], q) for spec in TABLE["specialist"] for q in spec["examples"]]
MISTAKES = [(m["query"], m["wrong"], m["correct"]) for m in TABLE["mistake"]]


def _route(text: str) -> list[str]:
    return [step.specialist for step in build_report(text).route]


@pytest.mark.parametrize("specialist,query", EXAMPLES)
def test_example_query_routes_to_its_specialist(specialist, query):
    assert _route(query)[0] == specialist


@pytest.mark.parametrize("query,wrong,correct", MISTAKES)
def test_routing_mistake_is_avoided(query, wrong, correct):
    route = _route(query)
    assert route[: len(correct)] == correct
    assert route[0] != wrong


@pytest.mark.parametrize("question", TABLE["question"], ids=lambda q: q["id"])
def test_ambiguous_queries_get_one_question(question):
    report = build_report(question["label"])
    assert report.question is not None
    assert report.route == [] and report.reports == []
    assert 3 <= len(report.question.choices) <= 5


def test_every_symptom_routes_to_known_specialists():
    from torchdoctor.model import SPECIALISTS

    for info in catalog.symptoms().values():
        assert info.route and set(info.route) <= set(SPECIALISTS), info.id


def test_precedence_rows_name_known_symptoms_and_specialists():
    from torchdoctor.model import SPECIALISTS

    for row in TABLE["precedence"]:
        assert set(row["order"]) <= set(SPECIALISTS)
        for sid in row["symptoms"]:
            catalog.symptom(sid)


def test_a_weak_secondary_symptom_does_not_pick_the_leading_row():
    from torchdoctor.router import route
    from torchdoctor.rules.catalog import make_symptom

    strong = make_symptom("oom", confidence=1.0)
    weak = make_symptom("slow-step", confidence=0.6)
    assert [s.specialist for s in route([strong, weak])] == ["memory", "profiling"]
    # a warning next to an error does not lead either, however sure
    assert route([strong, make_symptom("slow-step", confidence=1.0)])[0].specialist == "memory"
    # as strong and as severe as the OOM, it does: slow -> profiling first
    assert route([strong, make_symptom("slow-step", confidence=1.0, severity="error")])[0].specialist == "profiling"

"""The public evaluation cases (../shared/eval/ask_public.jsonl) route as labelled."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, SHARED
from torchdoctor.ask import build_report

EVAL = SHARED / "eval" / "ask_public.jsonl"
LOCAL = ROOT / "tests" / "data" / "ask_public.jsonl"  # a copy, for clones without ../shared
SOURCE = EVAL if EVAL.exists() else LOCAL
CASES = [json.loads(line) for line in SOURCE.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_public_case_routes_as_labelled(case):
    report = build_report(case["text"])
    if case["kind"] == "ambiguous":
        assert report.question is not None, [s.id for s in report.symptoms]
        if case["expected"]:
            assert report.question.specialist == case["expected"][0]
        return
    assert report.question is None, f"asked {report.question.text!r} instead of routing"
    route = [step.specialist for step in report.route]
    assert route[: len(case["expected"])] == case["expected"], (route, [s.id for s in report.symptoms])

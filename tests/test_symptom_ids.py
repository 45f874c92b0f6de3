"""Every symptom of the catalogue can be found by its id in a test, and is produced through a door.

The rows below are the ids no other test names: each runs a real input through the door that
recognises it (a script that fires the static rule, the message PyTorch prints, a user's question)
and asserts the id.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from torchdoctor.rules import catalog

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
RULE_FIXTURES = TESTS / "fixtures" / "check" / "rules"


def test_every_symptom_id_is_named_in_a_test():
    text = "\n".join(p.read_text() for p in TESTS.rglob("*.py"))
    unnamed = [sid for sid in catalog.symptoms() if not re.search(rf"[\"']{re.escape(sid)}[\"']", text)]
    assert not unnamed, f"symptom ids no test names: {unnamed}"


# -- check: a script that fires the rule ------------------------------------------------------------

BY_RULE = [
    ("empty-cache-in-loop", "TD103"),
    ("unregistered-parameters", "TD201"),
    ("missing-super-init", "TD203"),
    ("unregistered-buffer", "TD204"),
    ("manual-attention", "TD206"),
    ("functional-dropout-always-on", "TD209"),
    ("log-softmax-before-cross-entropy", "TD210"),
    ("shuffle-with-sampler", "TD302"),
    ("cuda-device-not-set", "TD306"),
    ("grad-sync-misplaced", "TD308"),
    ("backward-in-autocast", "TD405"),
    ("weight-decay-on-norm-bias", "TD411"),
    ("accumulation-not-applied", "TD415"),
    ("scaler-misuse", "TD416"),
    ("compile-in-loop", "TD505"),
    ("unstable-log-softmax", "TD604"),
    ("bce-after-sigmoid", "TD605"),
    ("training-in-validation", "TD606"),
    ("zero-dim-index", "TD607"),
    ("deprecated-api", "TD608"),
    ("ctx-misuse", "TD802"),
    ("function-called-directly", "TD803"),
    ("reentrant-checkpoint", "TD804"),
]


@pytest.mark.parametrize(("symptom", "code"), BY_RULE, ids=[s for s, _ in BY_RULE])
def test_check_finds_the_symptom_in_a_script_that_fires_its_rule(symptom, code):
    from torchdoctor.check import CheckRequest, build_report, prepare
    from torchdoctor.diagnosis import diagnose

    scripts = sorted(str(p) for p in (RULE_FIXTURES / code).glob("fire*.py"))
    request = CheckRequest(paths=scripts, fmt="json", jobs=1)
    report = diagnose(build_report(request, prepare(request)))
    found = {s.id: s for s in report.symptoms}
    assert symptom in found
    assert any(ev.source == code for ev in found[symptom].evidence)
    assert symptom in {sid for r in report.reports for sid in r.symptoms}  # a specialist wrote about it


# -- ask: the message PyTorch prints ----------------------------------------------------------------

BY_MESSAGE = [
    ("backward-twice", "backward-twice"),
    ("device-side-assert", "cuda-device-side-assert"),
    ("cuda-unavailable", "cuda-not-compiled"),
    ("index-out-of-range", "index-select-assert"),
    ("non-scalar-backward", "grad-scalar-outputs"),
    ("compile-failed", "inductor-backend-failed"),
]


def _example(signature_id: str) -> str:
    with open(ROOT / "rules" / "data" / "signatures.toml", "rb") as fh:
        return next(s["example"] for s in tomllib.load(fh)["signature"] if s["id"] == signature_id)


@pytest.mark.parametrize(("symptom", "signature"), BY_MESSAGE, ids=[s for s, _ in BY_MESSAGE])
def test_ask_finds_the_symptom_in_the_error_message(symptom, signature):
    from torchdoctor.ask import build_report

    report = build_report(_example(signature))
    found = {s.id: s for s in report.symptoms}
    assert symptom in found
    assert any(ev.source == signature for ev in found[symptom].evidence)


# -- ask: the user's question (topics) --------------------------------------------------------------

BY_QUESTION = [
    ("model-structure", "How to organize model components?", "module-design"),
    ("distributed-setup", "How do I set up DDP training on 4 GPUs?", "distributed"),
    ("mixed-precision-setup", "AMP vs full precision, how to enable autocast", "mixed-precision"),
    ("custom-function", "How do I write a custom autograd function?", "autograd"),
]


@pytest.mark.parametrize(("symptom", "question", "specialist"), BY_QUESTION, ids=[s for s, _, _ in BY_QUESTION])
def test_ask_routes_the_question_to_its_topic(symptom, question, specialist):
    from torchdoctor.ask import build_report

    report = build_report(question)
    assert symptom in [s.id for s in report.symptoms]
    assert report.route[0].specialist == specialist

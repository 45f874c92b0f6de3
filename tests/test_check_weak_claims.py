"""Findings whose claim rests on code the file cannot show report at info, the clear shapes stay warnings.

A rule may lower a finding's severity (`ctx.report(..., severity="info")`): info does not gate CI, and the
finding is still there for a reader (and for recall). Each weak shape here comes from real code where the
warning was wrong; its strong neighbour, where the file itself shows the problem, keeps the rule's severity.
"""

from __future__ import annotations

from tests.conftest import FIXTURES
from torchdoctor.rules.static.engine import analyse_text

RULES = FIXTURES / "check" / "rules"


def severities(text: str, code: str, path: str = "model.py") -> dict[int, str]:
    result = analyse_text(text, path, codes=[code])
    return {r.finding.line: r.finding.severity for r in result.results if r.finding.code == code}


def test_a_dropout_rate_handed_in_by_unseen_callers_is_info():
    text = (RULES / "TD209" / "fire_rate_from_unseen_caller.py").read_text()
    found = severities(text, "TD209")
    assert found and set(found.values()) == {"info"}, found


def test_the_same_rate_with_the_callers_in_the_file_stays_a_warning():
    text = (RULES / "TD209" / "fire_rate_from_unseen_caller.py").read_text() + '''

decoder = Decoder(8, 4, 16, 100)
logits, _ = decoder(torch.randn(2, 5, 8), torch.randn(2, 4), 0.3)
'''
    found = severities(text, "TD209")
    assert found and set(found.values()) == {"warning"}, found


def test_a_fixed_rate_stays_a_warning():
    found = severities((RULES / "TD209" / "fire.py").read_text(), "TD209")
    assert found and set(found.values()) == {"warning"}, found


def test_a_log_of_the_complement_of_a_parameter_is_info():
    # fire.py's `_neg_loss(pred, gt)` and `FocalLoss.forward(x, ...)`: `1 - pred` is 0 only if the caller's
    # prediction can round to 1, which this file cannot see (CenterNet clamps it three calls away).
    text = (RULES / "TD609" / "fire.py").read_text()
    found = severities(text, "TD609", "losses.py")
    lines = text.splitlines()
    weak = {n for n, line in enumerate(lines, 1) if "torch.log(p_t)" in line or "neg_loss = torch.log(1 - pred)" in line}
    assert weak and {found[n] for n in weak} == {"info"}, found
    assert {s for n, s in found.items() if n not in weak} == {"warning"}, found


def test_the_complement_of_a_sigmoid_made_here_stays_a_warning():
    text = '''
import torch

def focal_loss(logits, target, gamma=2.0):
    p = torch.sigmoid(logits)
    neg_loss = torch.log(1 - p) * p ** gamma * (1 - target)
    pos_loss = torch.log(p) * (1 - p) ** gamma * target
    return -(neg_loss + pos_loss).mean()
'''
    assert set(severities(text, "TD609", "losses.py").values()) == {"warning"}


def test_in_one_function_a_log_the_function_shows_wins_over_a_weak_one():
    text = '''
import torch

def mixed_loss(pred, logits):
    a = torch.log(1 - pred)
    b = torch.log(torch.sigmoid(logits))
    loss = a.mean() + b.mean()
    return loss
'''
    assert severities(text, "TD609", "losses.py") == {6: "warning"}


def test_forward_on_an_optional_argument_named_like_a_model_is_info():
    text = (RULES / "TD202" / "fire_optional_model_argument.py").read_text()
    found = severities(text, "TD202", "degradation.py")
    lines = text.splitlines()
    optional = next(n for n, line in enumerate(lines, 1) if "isp_model.forward" in line)
    required = next(n for n, line in enumerate(lines, 1) if "model.forward(x)" in line)
    assert found == {optional: "info", required: "warning"}, found

"""semantic/periods.py: which tests on a period can never pass when the period is 1."""

from __future__ import annotations

import ast

import pytest

from torchdoctor.rules.static.semantic.periods import never_at_period_one


def _test(source: str):
    return never_at_period_one(ast.parse(source, mode="eval").body)


@pytest.mark.parametrize("source, period, nonzero", [
    ("it % args.accum == 1", "args.accum", False),
    ("(step + 1) % cfg.TRAIN.ACCUM == 2", "cfg.TRAIN.ACCUM", False),
    ("1 == it % n", "n", False),
    ("it % n", "n", True),
    ("it % n != 0", "n", True),
    ("training and it % n == 1", "n", False),
])
def test_tests_that_never_pass_at_period_one(source, period, nonzero):
    found = _test(source)
    assert found is not None
    assert ast.unparse(found.period) == period and found.nonzero is nonzero


@pytest.mark.parametrize("source", [
    "it % n == 0",               # the remainder every period reaches
    "n == 1 or it % n == 1",     # the usual fix
    "it % 2 == 1",               # a period written as 2 is never 1
    "it % n == n - 1",           # 0 when n is 1
    "'%d' % it == 1",            # string formatting
    "not it % n",                # true at n == 1
    "it % n >= 1",               # not a test for one remainder
])
def test_tests_that_pass_at_period_one_or_say_nothing(source):
    assert _test(source) is None

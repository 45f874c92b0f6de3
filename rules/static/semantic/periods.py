"""Tests on a period (`i % n ...`) that can never pass when the period is 1.

Gradient accumulation, a GAN's critic ratio and "every n-th iteration" switches all test a counter modulo a
period read from the configuration. Any integer modulo 1 is 0, so a test that waits for another remainder
(`i % n == 1`, the "first micro-step of the window" when `i` counts from 1) or for a non-zero one (`if i % n:`,
`i % n != 0`) is false on every iteration once the period is set to 1, which is usually its default. Whatever
runs under such a test (a `zero_grad()`, an optimizer step) then never runs. A period written as a number of 2
or more is left alone: it cannot be 1.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class PeriodTest:
    """`test` waits for `counter % period` to be `remainder` (an int other than 0), or (`nonzero`) for any
    remainder but 0; either way it never passes when `period` is 1."""

    test: ast.expr  # the comparison (or the bare modulo) that decides it
    period: ast.expr
    nonzero: bool  # `if i % n:` / `i % n != 0`, rather than `i % n == 1`


def _modulo(expr: ast.AST) -> ast.BinOp | None:
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
        if isinstance(expr.left, ast.Constant) and isinstance(expr.left.value, str):
            return None  # "%d" % x: string formatting
        return expr
    return None


def _int(expr: ast.AST) -> int | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, int) and not isinstance(expr.value, bool):
        return expr.value
    return None


def _one_test(expr: ast.expr) -> PeriodTest | None:
    mod = _modulo(expr)
    if mod is not None:
        return PeriodTest(expr, mod.right, True)  # `if i % n:`
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1):
        return None
    left, right, op = expr.left, expr.comparators[0], expr.ops[0]
    mod = _modulo(left) or _modulo(right)
    other = right if mod is left else left
    value = _int(other)
    if mod is None or value is None:
        return None
    if isinstance(op, ast.Eq) and value != 0:
        return PeriodTest(expr, mod.right, False)  # `i % n == 1`
    if isinstance(op, ast.NotEq) and value == 0:
        return PeriodTest(expr, mod.right, True)  # `i % n != 0`
    return None


def never_at_period_one(test: ast.expr) -> PeriodTest | None:
    """The part of `test` that keeps it false at a period of 1, when `test` is such a test alone or one of the
    terms of an `and`. An `or` may let it pass another way (`n == 1 or i % n == 1`, the usual fix), and a period
    written as a number of 2 or more is never 1: neither is reported."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for part in parts:
        found = _one_test(part)
        if found is None:
            continue
        value = _int(found.period)
        if value is not None and value != 1:
            continue
        return found
    return None

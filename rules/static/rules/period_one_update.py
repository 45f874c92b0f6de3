"""TD418: the only zero_grad() (or optimizer step) of a training function waits for a test on a period that
never passes when the period is 1.

`if iteration % iteration_per_update == 1: optimizer.zero_grad()` clears the gradients on the first micro-step of
each accumulation window while the period is 2 or more; at 1 (no accumulation, often the default) `x % 1` is 0 on
every iteration, so the gradients are never cleared and each step applies the sum of all earlier ones. The same
holds for a step under `if i % n:` or `i % n != 0`. The tests themselves are read by semantic/periods.py.
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.api import Context, rule
from torchdoctor.rules.static.index import Index
from torchdoctor.rules.static.rules.mixed_precision import number
from torchdoctor.rules.static.semantic.periods import PeriodTest, never_at_period_one

_CLEAR_EFFECT = "the gradients are then never cleared, so every optimizer step applies the sum of all earlier gradients"
_STEP_EFFECT = "the optimizer then never steps"
_NONZERO_EFFECT = " (and for a period n above 1 it runs on every iteration but the n-th)"


def _tested(index: Index, test: ast.expr) -> ast.expr:
    """What an `if` tests, read through a name assigned once before it (`first = i % n == 1; if first:`) or a
    helper of this file whose body returns one expression (`def should_zero_grad(self): return self.count %
    self.accumulation_steps == 1`)."""
    if isinstance(test, ast.Name):
        values = index.definitions(test.id, test)
        if len(values) == 1:
            return values[0]
    if isinstance(test, ast.Call) and not test.args and not test.keywords:
        fn = index.local_target(test)
        body = [s for s in getattr(fn, "body", []) if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
            return body[0].value
    return test


def _period_guard(index: Index, call: ast.AST, fn: ast.AST | None) -> tuple[ast.If, PeriodTest] | None:
    """The innermost `if` around `call` (in its body, not its `else`) whose test never passes at a period of 1."""
    child, node = call, index.parent(call)
    while node is not None and node is not fn:
        if isinstance(node, ast.If) and child in node.body:
            found = never_at_period_one(_tested(index, node.test))
            if found is not None:
                return node, found
        child, node = node, index.parent(node)
    return None


def _inside(index: Index, node: ast.AST, container: ast.AST) -> bool:
    return any(anc is container for anc in index.ancestors(node))


def _same_pass(index: Index, call: ast.AST, fn: ast.AST | None, calls: list[ast.Call]) -> list[ast.Call]:
    """The calls of the same kind that run on each pass `call` runs on: in its loop when it has one (a
    `zero_grad()` once before the loop does not clear per step), else anywhere in its function."""
    loop = index.loop_of(call)
    if loop is not None:
        return [c for c in calls if _inside(index, c, loop.node)]
    return [c for c in calls if index.function_of(c) is fn]


@rule("TD418", ast.Module)
def update_never_at_period_one(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    if not index.backward_calls:
        return
    training = {index.function_of(c) for c in index.backward_calls}
    clears = list(index.method_calls("zero_grad"))
    steps = list(index.step_calls)
    reported: set[ast.If] = set()
    for kind, calls in (("step", steps), ("clear", clears)):
        for call in calls:
            fn = index.function_of(call)
            if fn not in training:
                continue  # no backward in this function: an update we cannot tie to a training step
            guard = _period_guard(index, call, fn)
            if guard is None or guard[0] in reported:
                continue  # no such test, or its step was reported already (the clear under it says no more)
            if_node, found = guard
            if found.nonzero:
                loop = index.loop_of(call)
                if loop is None or not _inside(index, if_node, loop.node):
                    continue  # `if i % n != 0: optimizer.step()` after the loop: the flush of a last partial window
            value = number(ctx, found.period, call)
            if value is not None and value >= 2:
                continue  # the period resolves to a number that is not 1 here
            if any(other is not call and _period_guard(index, other, fn) is None for other in _same_pass(index, call, fn, calls)):
                continue  # the same loop (or function) clears (or steps) on a path the test does not hold back
            effect = _CLEAR_EFFECT if kind == "clear" else _STEP_EFFECT
            if found.nonzero:
                effect += _NONZERO_EFFECT
            reported.add(if_node)
            ctx.report(call, call=ctx.segment(call, 50), condition=ctx.segment(found.test, 60),
                       accum_expr=ctx.segment(found.period, 40), effect=effect)

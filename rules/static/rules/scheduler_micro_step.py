"""TD417: a learning-rate scheduler stepped on every micro-step of a gradient-accumulation loop.

Under accumulation the optimizer updates once per n micro-batches. A `scheduler.step()` that runs on every
micro-batch advances the schedule n times per update: warm-up ends n times early, decay reaches its floor a
fraction of the way into the run, and a OneCycleLR sized in updates raises "Tried to step ... times" near the
end. The accumulation loops are the ones TD413 reads (a step under `if (i + 1) % n == 0`, or a `for _ in
range(n)` micro-step loop); a third shape is a loop that hands each batch to a helper of its own class or file
whose optimizer step waits for an accumulation counter (`if self._grad_count == self.gradient_acc:`).
"""

from __future__ import annotations

import ast
import re

from torchdoctor.rules.static.api import Context, rule
from torchdoctor.rules.static.index import Index, Loop, dotted
from torchdoctor.rules.static.rules.mixed_precision import (
    _ACCUM_NAME,
    _between,
    _find_mod,
    _mod_guard,
    accumulations,
    schedules,
)

# `lr_scheduler`, `self.sched`; not a diffusion noise scheduler (`noise_scheduler.step(noise_pred, t, x)`).
_SCHED_NAME = re.compile(r"sched", re.I)
_NOT_LR = re.compile(r"noise|diffusion|sampler", re.I)
# TD413's accumulation names, and `gradient_acc` (holocron's attribute), which none of them spells.
_ACCUM = re.compile(_ACCUM_NAME.pattern + r"|gradient_acc", re.I)


@rule("TD417", ast.Module)
def scheduler_stepped_every_micro_step(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    reported: set[ast.Call] = set()

    def report(call: ast.Call, step_call: ast.AST, accum_expr: ast.AST) -> None:
        if call in reported:
            return
        reported.add(call)
        ctx.report(call, variable=ctx.segment(call.func.value, 40),  # type: ignore[attr-defined]
                   step_call=ctx.segment(step_call, 40), accum_expr=ctx.segment(accum_expr, 40))

    for acc in accumulations(ctx):
        for call in _lr_steps(ctx, acc.loop.calls):
            if acc.style == "modulo" and (_mod_guard(index, call, acc.loop) is not None or _conditional(index, call, acc.loop)):
                continue  # under the step's own test, or under some test we do not read
            report(call, acc.steps[0], acc.count)
    for loop in index.loops.values():
        _through_a_helper(ctx, loop, report)


def _lr_steps(ctx: Context, calls: list[ast.Call]) -> list[ast.Call]:
    """`scheduler.step()` calls with no argument (an explicit count, `step(global_step)`, sets the position
    itself) on a scheduler built in this file or on a name that says so."""
    table = schedules(ctx)
    optimizer_steps = set(ctx.index.step_calls)
    found = []
    for call in calls:
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr == "step") or call.args or call.keywords:
            continue
        if call in optimizer_steps:
            continue
        name = dotted(func.value) or ""
        if name in table:
            found.append(call)
        elif not _NOT_LR.search(name) and (_SCHED_NAME.search(name)
                                           or ctx.index.kind_of(func.value, guess=False) == "scheduler"):
            found.append(call)  # the last: a scheduler another file's factory returned (`build_lr_policy(...)`)
    return found


def _conditional(index: Index, call: ast.AST, loop: Loop) -> bool:
    return any(isinstance(anc, ast.If | ast.IfExp | ast.Try | ast.ExceptHandler) for anc, _ in _between(index, call, loop.node))


def _through_a_helper(ctx: Context, loop: Loop, report) -> None:  # type: ignore[no-untyped-def]
    """The loop steps its scheduler on every batch and hands the batch's loss to a helper of this file
    (`self._backprop_step(loss)`) that runs the backward and steps the optimizer only when an accumulation
    test passes (holocron's Trainer before its fix)."""
    index = ctx.index
    steps = set(index.step_calls)
    if any(c in steps for c in loop.calls):
        return  # the loop steps the optimizer itself: the accumulation loops above
    sched = [c for c in _lr_steps(ctx, loop.calls) if not _conditional(index, c, loop)]
    if not sched:
        return
    for call in loop.calls:
        fn = index.local_target(call)
        if fn is None:
            continue
        guarded = _accumulating_step(index, fn)
        if guarded is not None:
            for s in sched:
                report(s, guarded[0], guarded[1])
            return


def _accumulating_step(index: Index, fn: ast.AST) -> tuple[ast.Call, ast.expr] | None:
    """(optimizer step, accumulation count) when `fn` runs a backward and every optimizer step it makes waits
    for an accumulation test: `if (i + 1) % accum == 0`, `if self._grad_count == self.gradient_acc`."""
    calls = index.calls_in(fn)
    steps = set(index.step_calls)
    backward = set(index.backward_calls)
    mine = [c for c in calls if c in steps]
    if not mine or not any(c in backward for c in calls):
        return None
    count: ast.expr | None = None
    for call in mine:
        found = None
        for anc, _ in _between(index, call, fn):
            if isinstance(anc, ast.If):
                found = _accumulation_test(index, anc)
                if found is not None:
                    break
        if found is None:
            return None
        count = count or found
    return (mine[0], count) if count is not None else None


def _accumulation_test(index: Index, node: ast.If) -> ast.expr | None:
    """The accumulation count an `if` waits for: the modulus of `% n`, or a compared name that reads as one."""
    mod = _find_mod(index, node.test, node)
    if mod is not None:
        return mod if _ACCUM.search(dotted(mod) or "") or isinstance(mod, ast.Constant) else None
    for part in ast.walk(node.test):
        if isinstance(part, ast.Compare):
            for side in (part.left, *part.comparators):
                if isinstance(side, ast.Name | ast.Attribute) and _ACCUM.search(dotted(side) or ""):
                    return side
    return None

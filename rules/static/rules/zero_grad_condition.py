"""TD419: the gradients are cleared only under a condition that the optimizer step and the backward do not share.

`backward()` adds into `.grad`; `zero_grad()` is what makes each step apply one step's gradients. When the only
clear of a training step sits under a test that the step does not also wait for (a logging interval, an optional
scheduler, the first batch of an epoch, an `except` branch for a batch that failed), every pass the test skips runs
a backward on top of gradients already applied, and the next step applies them again. Two pairings are the healthy
accumulation window and are left alone: the clear and the step under remainder tests of a counter (`if i % n == 0:
zero_grad()` ... `if (i + 1) % n == 0: step()`), and a clear in each branch of one `if`. TD418 speaks for a clear
whose period test never passes at 1, TD410 for a loop with no clear at all.
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.api import Context, rule
from torchdoctor.rules.static.index import Index
from torchdoctor.rules.static.rules.mixed_precision import _find_mod, is_engine_backward
from torchdoctor.rules.static.semantic.periods import never_at_period_one

# One condition a statement runs under: the `if` (or `try` handler) node, and which of its branches holds it.
Guard = tuple[ast.AST, str]


def _guards(index: Index, node: ast.AST, scope: ast.AST) -> list[Guard] | None:
    """The branches between `node` and its scope, innermost first; None when a loop of its own or a function
    sits between them (the call runs some other number of times per pass, which this rule does not read)."""
    found: list[Guard] = []
    child = node
    for anc in index.ancestors(node):
        if anc is scope:
            return found
        if isinstance(anc, ast.For | ast.AsyncFor | ast.While | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return None
        if isinstance(anc, ast.If):
            found.append((anc, "body" if child in anc.body else "orelse" if child in anc.orelse else "test"))
        elif isinstance(anc, ast.ExceptHandler):
            found.append((anc, "handler"))
        child = anc
    return None


def _same_test(a: Guard, b: Guard) -> bool:
    """The same branch of one `if`, or of two `if`s that test the same thing (`if phase == "train":` before the
    forward and again before the backward, the PyTorch transfer-learning tutorial's shape)."""
    if a[1] != b[1]:
        return False
    if a[0] is b[0]:
        return True
    return isinstance(a[0], ast.If) and isinstance(b[0], ast.If) and ast.dump(a[0].test) == ast.dump(b[0].test)


def _other_branch_clears(guard: Guard, clears: list[ast.Call]) -> bool:
    """`if use_amp: ...; opt.zero_grad()` / `else: ...; opt.zero_grad()`: both ways clear."""
    node, branch = guard
    if not isinstance(node, ast.If) or branch not in ("body", "orelse") or not node.orelse:
        return False
    other = node.orelse if branch == "body" else node.body
    inside = {id(n) for stmt in other for n in ast.walk(stmt)}
    return any(id(c) in inside for c in clears)


def _remainder_test(index: Index, guard: Guard) -> bool:
    node = guard[0]
    return isinstance(node, ast.If) and _find_mod(index, node.test, node) is not None


def _unread_clears(scope: ast.AST) -> bool:
    """Gradients handled by hand in the pass (`p.grad = None`, `p.grad.zero_()`): clears this rule does not read."""
    return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(scope))


@rule("TD419", ast.Module)
def zero_grad_under_condition(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    if not index.backward_calls or not index.step_calls:
        return
    all_clears = set(index.method_calls("zero_grad"))
    if not all_clears:
        return
    backward = set(index.backward_calls)
    reported: set[ast.AST] = set()
    for step in index.step_calls:
        if index.kind_of(step.func.value) == "optimizer" and (step.args or step.keywords):  # type: ignore[attr-defined]
            continue  # `optimizer.step(closure)` (L-BFGS): the closure clears and recomputes the gradients
        scope, calls = _pass_of(index, step)
        if scope is None or scope in reported:
            continue
        step_guards = _guards(index, step, scope)
        if step_guards is None:
            continue
        clears = [c for c in calls if c in all_clears]
        backs = [c for c in calls if c in backward]
        if not clears or not backs or _unread_clears(scope) or _helper_clears(index, calls):
            continue
        if all(is_engine_backward(b) for b in backs):
            continue  # `accelerator.backward(loss)`: a prepared optimizer's step and zero_grad skip the passes
            # that do not sync, so a clear under `if accelerator.sync_gradients:` is every clear that counts
        skipped = _skipping_clear(index, clears, step_guards, scope)
        if skipped is None:
            continue
        clear, guard = skipped
        if any(_same_test(guard, g) for b in backs for g in (_guards(index, b, scope) or [])):
            continue  # a backward waits for the same test: nothing piles up on the passes it skips
        reported.add(scope)
        ctx.report(clear, variable=ctx.segment(clear.func.value, 40),  # type: ignore[attr-defined]
                   condition=_condition_text(ctx, guard), step_call=ctx.segment(step, 40),
                   backward_call=ctx.segment(backs[0], 40))


def _pass_of(index: Index, step: ast.Call) -> tuple[ast.AST | None, list[ast.Call]]:
    """One pass of training for this step, and its calls: the step's loop (with the loops inside it), else the
    function that runs the step (a trainer's `train_step`, called once per batch by a loop elsewhere)."""
    loop = index.loop_of(step)
    if loop is not None:
        return loop.node, list(loop.all_calls())
    fn = index.function_of(step)
    return (fn, index.calls_in(fn)) if fn is not None else (None, [])


def _helper_clears(index: Index, calls: list[ast.Call]) -> bool:
    """A function of this file called in the pass clears gradients (`self.reset_grad()`): a clear this rule does
    not follow, so it says nothing."""
    for call in calls:
        target = index.local_target(call)
        if target is not None and any(isinstance(c.func, ast.Attribute) and c.func.attr == "zero_grad"
                                      for c in index.calls_in(target)):
            return True
    return False


def _condition_text(ctx: Context, guard: Guard) -> str:
    node, branch = guard
    if isinstance(node, ast.ExceptHandler):
        return f"`except {ctx.segment(node.type, 40)}`" if node.type is not None else "a bare `except`"
    test = ctx.segment(node.test, 50)  # type: ignore[attr-defined]
    return f"`not ({test})`" if branch == "orelse" else f"`{test}`"


def _skipping_clear(index: Index, clears: list[ast.Call], step_guards: list[Guard],
                    scope: ast.AST) -> tuple[ast.Call, Guard] | None:
    """A clear and the condition of it the step does not share, when no clear of the pass runs whenever the step
    does; None otherwise."""
    first: tuple[ast.Call, Guard] | None = None
    for clear in clears:
        guards = _guards(index, clear, scope)
        if guards is None:
            return None  # a clear inside an inner loop: it runs some number of times we do not read
        own = [g for g in guards if not any(_same_test(g, s) for s in step_guards)
               and not _other_branch_clears(g, clears)]
        if not own:
            return None  # this clear runs whenever the step does
        if any(_remainder_test(index, g) for g in own) and any(_remainder_test(index, s) for s in step_guards):
            return None  # an accumulation window: cleared when it opens, stepped when it closes
        if any(isinstance(g[0], ast.If) and never_at_period_one(g[0].test) is not None for g in own):
            return None  # TD418's claim: a period test that never passes at 1
        if first is None:
            first = (clear, own[-1])  # the outermost condition the step does not share
    return first


"""The project's own practice: how its evaluation functions run the model, and the one that does otherwise.

A rule reads one file's code against what it knows of PyTorch. A project also says what it means itself: when
three of its four evaluation functions turn autograd off, the fourth that does not is most likely an oversight,
whatever its code looks like. This module asks that question once per file, for every evaluation function (a
function named like one, or one that switches a model to `.eval()`, that runs the model in a loop and never
calls backward or steps an optimizer), and records two answers: is autograd off at the model call, and is the
model put in eval mode. The project pass (`deviants`) compares each function with the project's others; the rule
of the family (TD102 for autograd, TD601 for the mode) reports the function that answers differently from at
least half of them, naming one that answers right.

A function does not deviate when its context differs on purpose: a file under tests/ or benchmarks/ (checked
apart, never a sibling), a function that calls backward or autograd.grad (an evaluation that needs gradients),
one whose every caller in the project already runs it under no_grad or after `.eval()` (callcontext.py).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from torchdoctor.rules.static.api import Context
from torchdoctor.rules.static.callcontext import call_context, leave_sites
from torchdoctor.rules.static.project import Project, ProjectHit
from torchdoctor.rules.static.semantic.callsites import function_identity
from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import dotted

SITES = "practice-evaluation"
COVERED = "practice-covered"

# what the function's name says it does (`evaluate`, `_eval_epoch`, `validate`, `test_seg`, `predict`)
_EVAL_NAME = re.compile(r"eval|valid|test|infer|predict", re.I)
# a file whose functions are checks of the project, not the project's practice: tests, benchmarks
# a function that serves predictions (a model's own `predict`, an `infer` helper) plays another role than one
# that measures the model on held-out data: each is compared only with functions of its own role
_PREDICT_NAME = re.compile(r"infer|predict", re.I)
_SKIPPED_PATH = re.compile(r"(?:^|/)(?:tests?|benchmarks?)/|(?:^|/)test_[^/]*\.py$|_test\.py$")
# calls that make a function train, or need the gradients an evaluation does without
_GRADIENT_ATTRS = frozenset({"backward", "step", "zero_grad", "grad", "requires_grad_"})
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def leave_evaluations(ctx: Context) -> None:
    """This file's evaluation functions and their two answers, once per file whichever rule asks first."""
    ctx.memo(SITES, lambda: _leave(ctx))


def note_covered(ctx: Context, code: str) -> None:
    """The lines the file's own analysis reported for `code`: a deviant there is not said twice. (A finding it
    deferred to the project pass is said once by the engine, which keeps the first project finding of a line.)"""
    lines = sorted({getattr(h.node, "lineno", 0) for h in ctx.hits if h.rule.doc.code == code})
    if lines:
        ctx.leave(COVERED, {"code": code, "lines": lines})


def _leave(ctx: Context) -> bool:
    if _SKIPPED_PATH.search(ctx.path.replace("\\", "/")):
        return True
    index = ctx.index
    # the cheap gate: only functions with an evaluation name, or one that calls `.eval()`
    switched = {index.function_of(c) for c in index.method_calls("eval") if not c.args and not c.keywords}
    looping = {index.function_of(lp.node) for lp in index.loops.values()}  # the run is in a loop: no loop, no site
    # `def` only: an `async def` evaluation is rare in training code, and asking for that node kind alone would
    # cost the engine another walk of every file
    for fn in index.nodes(ast.FunctionDef):
        if fn not in looping or fn not in switched and not _EVAL_NAME.search(fn.name):  # type: ignore[attr-defined]
            continue
        site = _evaluation(ctx, fn)  # type: ignore[arg-type]
        if site is not None:
            ctx.leave(SITES, site)
    leave_sites(ctx)
    return True


def _evaluation(ctx: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any] | None:
    """The function's answers, or None when it is no evaluation function (no model run in a loop, or it trains)."""
    index = ctx.index
    if index.framework_context(fn):
        return None  # a Lightning evaluation hook: the framework sets grad and mode, not the project's practice
    # the function's own calls, read from its subtree: the file's table of calls by function (index.calls_in)
    # costs a pass over every call of the file, where most files have no evaluation function at all
    calls = sorted((n for n in subtree(fn) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    receivers: set[str] = set()
    switched = False
    for c in calls:
        func = c.func
        if not isinstance(func, ast.Attribute):
            continue
        if func.attr in _GRADIENT_ATTRS or dotted(func) in ("torch.autograd.grad", "autograd.grad"):
            return None  # it trains, or its evaluation needs gradients: another question
        if func.attr == "eval" and not c.args and not c.keywords or \
                func.attr == "train" and any(isinstance(a, ast.Constant) and a.value is False
                                             for a in [*c.args, *(k.value for k in c.keywords)]):
            name = dotted(func.value)
            if name:
                receivers.add(name)
                switched = True
    run = next((c for c in calls if _in_loop(index, c, fn) and _runs_model(index, c, receivers)), None)
    if run is None:
        return None
    loop = index.enclosing(run, _LOOPS)
    source = ctx.segment(loop.iter, 50) if isinstance(loop, ast.For | ast.AsyncFor) else "its batches"
    cls, name = function_identity(index, fn)
    model = run.func.value if isinstance(run.func, ast.Attribute) and run.func.attr == "forward" else run.func
    role = "predict" if _PREDICT_NAME.search(name) else "evaluate"
    return {"class": cls, "function": name, "role": role, "start": fn.lineno, "end": fn.end_lineno or fn.lineno,
            "line": run.lineno, "col": run.col_offset + 1, "variable": dotted(model) or ctx.segment(model, 40),
            "loader": source or "its batches", "grad_off": index.grad_disabled(run),
            "eval": switched or _eval_reached(index, fn)}


def _mode_before(index, fn: ast.AST, line: int) -> str | None:
    """"eval" or "train": the last mode switch in `fn`'s own body before `line`; None when there is none."""
    last = None
    for c in index.calls_in(fn):
        if c.lineno >= line:
            break
        if isinstance(c.func, ast.Attribute) and c.func.attr in ("eval", "train") and not c.keywords:
            off = c.func.attr == "eval" and not c.args or \
                bool(c.args) and isinstance(c.args[0], ast.Constant) and c.args[0].value is False
            last = "eval" if off else "train"
    return last


def _eval_reached(index, fn: ast.AST, depth: int = 0) -> bool:
    """Every call of `fn` in this file comes after an `.eval()` that is still in force (the caller's own last
    switch, or, when it switches nothing, its callers' in turn, up to three calls up): TextClassifierTrainer's
    `train()` calls `self.model.eval()`, then `self.evaluate(...)`, which need not switch again."""
    callers = index.callers(fn)
    if not callers or depth > 2:
        return False
    for call in callers:
        outer = index.function_of(call)
        if outer is None or outer is fn:
            return False
        mode = _mode_before(index, outer, call.lineno)
        if mode == "train" or mode is None and not _eval_reached(index, outer, depth + 1):
            return False
    return True


def _in_loop(index, node: ast.AST, fn: ast.AST) -> bool:
    for anc in index.ancestors(node):
        if anc is fn:
            return False
        if isinstance(anc, _LOOPS):
            return True
    return False


def _runs_model(index, call: ast.Call, receivers: set[str]) -> bool:
    """`net(x)` or `self.model.forward(x)` for a model the function switched to `.eval()`, or a call the semantic
    model knows runs a model."""
    func = call.func
    forward = isinstance(func, ast.Attribute) and func.attr == "forward"
    name = dotted(func.value) if forward else dotted(func)  # type: ignore[union-attr]
    if receivers and name:
        return name in receivers
    # `self.model.forward(batch)` in a function named like an evaluation: an explicit forward runs a module. A
    # helper of this file that runs the model (`eval_epoch(loader, model)`) is not the run: it answers for itself
    return forward and name is not None or index.local_target(call) is None and index.call_runs_model(call)


def deviants(project: Project, answer: str) -> list[tuple[Any, dict[str, Any], str]]:
    """(file, site, practice text) for each evaluation function whose `answer` ("grad_off" or "eval") is no while
    at least half of the project's other evaluation functions of the same role (and at least one) answer yes."""
    sites = list(project.facts(SITES))
    if len(sites) < 2 or not any(s[answer] for _, s in sites):
        return []
    code = "TD102" if answer == "grad_off" else "TD601"
    covered = {(f.path, line) for f, fact in project.facts(COVERED) if fact["code"] == code for line in fact["lines"]}
    context = call_context(project)
    under = "no_grad" if answer == "grad_off" else "eval"
    out = []
    for f, site in sites:
        if site[answer]:
            continue
        if any((f.path, line) in covered for line in range(site["start"], site["end"] + 1)):
            continue  # the file's own analysis said it already
        others = [(g, s) for g, s in sites
                  if s["role"] == site["role"] and (g.path, s["start"]) != (f.path, site["start"])]
        right = [(g, s) for g, s in others if s[answer]]
        if not right or 2 * len(right) < len(others):
            continue
        if context.callers_all(f, site["function"], under, site["class"]):
            continue  # every caller runs it under no_grad / after .eval(): its context settles it
        g, s = min(right, key=lambda r: (r[0].path != f.path, r[0].path, r[1]["start"]))
        name = f"{s['class']}.{s['function']}" if s["class"] else s["function"]
        what = "turn autograd off" if answer == "grad_off" else "call `.eval()` first"
        text = (f"the project's other evaluation functions {what} ({len(right)} of {len(others)}, "
                f"e.g. `{name}` at {g.path}:{s['line']})")
        out.append((f, site, text))
    return out


def hits(project: Project, answer: str, values) -> list[ProjectHit]:
    """The deviants as findings of the family's rule, at info (their precision is judged in notes_practice.md)."""
    return [ProjectHit(f.path, site["line"], site["col"], values(site, text), severity="info")
            for f, site, text in deviants(project, answer)]

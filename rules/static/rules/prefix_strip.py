"""TD708: the `module.` prefix cut off every key of a state dict by position, with no test that it is there.

A checkpoint saved from a DataParallel/DDP wrapper has keys `module.conv1.weight`; one saved from the bare
model has `conv1.weight`. `k[7:]` turns the second into `1.weight`: the load then fails on every key, or with
strict=False silently loads nothing. Which kind a file holds depends on how the run that wrote it was
launched, so the code that reads it has to look.
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.api import Context, rule
from torchdoctor.rules.static.index import Index, is_constant

_PREFIX = "module."


@rule("TD708", ast.Module, reads=(ast.Subscript,))
def module_prefix_cut_unchecked(node: ast.Module, ctx: Context) -> None:
    # `k[7:]`: one loop over the file's subscripts, the shape tested inline, instead of a check called on each
    name, slice_ = ast.Name, ast.Slice
    for sub in ctx.index.nodes(ast.Subscript):
        if sub.value.__class__ is name and sub.slice.__class__ is slice_ and _cuts_prefix_length(sub.slice):  # type: ignore[attr-defined]
            _prefix_cut_unchecked(sub, ctx)  # type: ignore[arg-type]


def _prefix_cut_unchecked(node: ast.Subscript, ctx: Context) -> None:
    index = ctx.index
    key = node.value.id
    if not _iterated_key(index, node, key):
        return
    scope = index.function_of(node) or index.statement_of(node)
    if scope is None or not _mentions_module(ctx, scope, node) or _tests_prefix(scope):
        return
    if _every_caller_tests(index, scope):
        return
    reported: set[ast.AST] = ctx.memo("TD708-scopes", set)  # one finding per function: one loop, one fix
    if scope in reported:
        return
    reported.add(scope)
    ctx.report(node, variable=ctx.segment(node, 40))


def _cuts_prefix_length(part: ast.AST) -> bool:
    """`[7:]` or `[len("module."):]`, with nothing after the colon."""
    if not isinstance(part, ast.Slice) or part.upper is not None or part.step is not None:
        return False
    lower = part.lower
    if is_constant(lower, 7):
        return True
    return (isinstance(lower, ast.Call) and isinstance(lower.func, ast.Name) and lower.func.id == "len"
            and len(lower.args) == 1
            and is_constant(lower.args[0], _PREFIX))


def _iterated_key(index: Index, node: ast.AST, key: str) -> bool:
    """`key` is the loop variable of a loop or comprehension over a mapping's keys or items around `node`."""
    for parent in index.ancestors(node):
        generators = parent.generators if isinstance(parent, ast.DictComp | ast.ListComp | ast.SetComp
                                                     | ast.GeneratorExp) else []
        loops = [(g.target, g.iter) for g in generators]
        if isinstance(parent, ast.For):
            loops.append((parent.target, parent.iter))
        for target, source in loops:
            names = [target] if isinstance(target, ast.Name) else list(target.elts)[:1] \
                if isinstance(target, ast.Tuple) else []
            if any(isinstance(n, ast.Name) and n.id == key for n in names) and _over_mapping(source, target):
                return True
    return False


def _over_mapping(source: ast.AST, target: ast.AST) -> bool:
    if isinstance(source, ast.Call) and isinstance(source.func, ast.Name) and source.func.id in ("list", "sorted") \
            and len(source.args) == 1:
        return _over_mapping(source.args[0], target)  # `for k in list(sd.keys()):`
    if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute):
        if source.func.attr == "items":
            return isinstance(target, ast.Tuple)
        return source.func.attr == "keys"
    return isinstance(source, ast.Name | ast.Attribute | ast.Subscript) and isinstance(target, ast.Name)


def _mentions_module(ctx: Context, scope: ast.AST, node: ast.AST) -> bool:
    """A bare `7` is taken for `len("module.")` only where the code says so (a comment, a string)."""
    first = getattr(scope, "lineno", node.lineno)
    last = getattr(scope, "end_lineno", node.lineno) or node.lineno
    return any("module" in line for line in ctx.lines[first - 1:last])


def _tests_prefix(scope: ast.AST) -> bool:
    """The code looks at the keys before cutting: `k.startswith("module.")`, `"module" in k`, `k[:7] ==
    "module."`, also on the first key only (`next(iter(sd)).startswith(...)`), anywhere in the function."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
            return True
        if isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Constant) and isinstance(side.value, str) and "module" in side.value
            for side in (node.left, *node.comparators)
        ):
            return True
    return False


def _every_caller_tests(index: Index, fn: ast.AST) -> bool:
    """A helper (`def remove_module(d): return {k[7:]: v ...}`) whose every call in this file runs under a test of
    the keys (`if "module." in keys[1]: d = remove_module(d)`): the check is the caller's."""
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    calls = index.callers(fn)
    return bool(calls) and all(
        any(isinstance(up, ast.If | ast.IfExp) and _tests_prefix(up.test) for up in index.ancestors(call))
        for call in calls
    )

"""Which functions compute a loss, known by how their value is used rather than by their name, and who calls them.

A rule about loss code (a log that must not see 0, a division by a count that can be 0) first asks whether it is
reading a loss. The name says so often (`focal_loss`, `FocalLoss.forward`), but not always: `bce(p, y)` picked from
`LOSSES[args.loss]`, `f(a, b)` in a notebook, `compute(pred, target)` on a trainer. Their use says it: the value of
a call is what `backward()` runs on, or is bound to a name that is (`l = f(o, t); l.backward()`), or to a name
called a loss (`loss = loss_fn(out, y)`).

`calls_of(index, fn)` lists the calls of a function of the file that reach it: direct calls and `self.` methods
(the index's callers), calls through another name bound to it (`loss_fn = bce`), and calls through a table that
holds it (`LOSSES = {"bce": bce, ...}` then `LOSSES[name](...)` or `loss_fn = LOSSES[name]; loss_fn(...)`): a
function picked at run time from a table may be the one that runs. `used_as_loss(index, call)` says whether one
call's value is a loss by its use; `computes_a_loss(index, fn)` whether some call of the function's is.
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import FUNCTIONS, dotted


def _holders(index, fn: ast.AST) -> tuple[set[str], set[str]]:
    """(names bound to the function itself, names of tables holding it) among the file's assignments."""
    name = getattr(fn, "name", None)
    if name is None:
        return set(), set()
    named, held, picked = _holding_names(index)
    aliases = set(named.get(name, ()))
    tables = held.get(name, set())
    for table in tables:  # `loss_fn = LOSSES[args.loss]`
        aliases.update(picked.get(table, ()))
    return aliases, set(tables)


def _holding_names(index) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """One pass over the file's assignments for every function asked: (a name -> the names assigned it, a name
    -> the tables (dict, list, tuple) assigned with it among their values, a table -> the names assigned one of its
    items). Asked per function, the same pass cost a loop over all the file's assignments each time."""
    cached = index.__dict__.get("_lossuse_holding")
    if cached is None:
        named: dict[str, set[str]] = {}
        held: dict[str, set[str]] = {}
        picked: dict[str, set[str]] = {}
        name_cls = ast.Name
        for target, values in index.assigned_values().items():
            for value in values:
                if isinstance(value, ast.Name):
                    named.setdefault(value.id, set()).add(target)
                elif isinstance(value, ast.Dict | ast.List | ast.Tuple):
                    for v in value.values if isinstance(value, ast.Dict) else value.elts:
                        if v.__class__ is name_cls:
                            held.setdefault(v.id, set()).add(target)
                elif isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name):
                    picked.setdefault(value.value.id, set()).add(target)
        cached = index.__dict__["_lossuse_holding"] = (named, held, picked)
    return cached


def calls_of(index, fn: ast.AST) -> list[ast.Call]:
    """The calls of the file that may run `fn`: its callers, and calls through a name or a table holding it."""
    found = list(index.callers(fn))
    if not isinstance(fn, FUNCTIONS) or index.class_of(fn) is not None:
        return found
    aliases, tables = _holders(index, fn)
    if not aliases and not tables:
        return found
    seen = {id(c) for c in found}
    for call in index.nodes(ast.Call):
        func = call.func  # type: ignore[attr-defined]
        if id(call) in seen:
            continue
        if isinstance(func, ast.Name) and func.id in aliases or isinstance(func, ast.Subscript) and isinstance(
                func.value, ast.Name) and func.value.id in tables:
            found.append(call)  # type: ignore[arg-type]
    return found


def _backpropagated(index) -> set[str]:
    """The names `backward()` runs on in the file (`loss.backward()`, `scaler.scale(loss).backward()`)."""
    cached = index.__dict__.get("_lossuse_backpropagated")
    if cached is None:
        cached = set()
        for call in index.backward_calls:
            func = call.func
            target = func.value if isinstance(func, ast.Attribute) else None
            if isinstance(target, ast.Call) and target.args:  # `scaler.scale(loss).backward()`
                target = target.args[0]
            if target is None and call.args:
                target = call.args[0]  # `accelerator.backward(loss)`
            if target is not None:
                cached.update(d for n in subtree(target) if (d := dotted(n)))
        index.__dict__["_lossuse_backpropagated"] = cached
    return cached


def used_as_loss(index, call: ast.Call) -> bool:
    """The call's value is a loss: what backward runs on, or bound to a name that backward runs on or that is
    named for a loss (`loss = loss_fn(out, y)`, `l = f(o, t)` then `l.backward()`)."""
    backprop = _backpropagated(index)
    for anc in index.ancestors(call):
        if isinstance(anc, ast.Call) and anc in set(index.backward_calls):
            return True
        if isinstance(anc, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = anc.targets if isinstance(anc, ast.Assign) else [anc.target]
            names = [dotted(t) or "" for t in targets]
            return any("loss" in n.lower() or n in backprop for n in names)
        if isinstance(anc, ast.stmt):
            return False
    return False


def computes_a_loss(index, fn: ast.AST) -> bool:
    """Some call of the function in the file uses its value as a loss."""
    return any(used_as_loss(index, c) for c in calls_of(index, fn))

"""Syntax helpers every part of the semantic model shares: node kinds, dotted names, call arguments."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from operator import attrgetter
from typing import Any

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
WITHS = (ast.With, ast.AsyncWith)
# A name that says "micro-steps per optimizer step" (`accum_steps`, `args.gradient_accumulation_steps`): read by
# check's accumulation rules and by run's accumulation analysis, so both doors recognise the same divisors.
ACCUMULATION_NAME = re.compile(r"accum|micro|grad_acc|acc_steps|update_freq", re.I)



def dotted(expr: ast.AST | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    cls = expr.__class__
    if cls is ast.Name:
        return expr.id  # type: ignore[union-attr]
    if cls is not ast.Attribute:
        return None
    value = expr.value  # type: ignore[union-attr]
    if value.__class__ is ast.Name:  # the common `F.softmax`, `self.fc`
        return f"{value.id}.{expr.attr}"  # type: ignore[union-attr]
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
        return ".".join(reversed(parts))
    return None

def element_container(expr: ast.AST | None) -> ast.AST | None:
    """`self.nets["G"]` -> `self.nets`, `loaders[0]` -> `loaders`: an element taken from a container by a
    constant key has the kind of what the container holds. Anything else is returned as is."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
        return expr.value
    return expr


def keyed_name(expr: ast.AST | None) -> str | None:
    """`self.data_loader['dev']` for a container element with a constant key, else None."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
        base = dotted(expr.value)
        if base is not None:
            return f"{base}[{expr.slice.value!r}]"
    return None


def last_name(expr: ast.AST | None) -> str | None:
    """The last component of a name, attribute or call: `self.model` -> model, `f()` -> f."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return None

def kwarg(call: ast.Call, name: str, position: int | None = None) -> ast.expr | None:
    """A call's argument by keyword, or by position when given."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if position is not None and len(call.args) > position:
        arg = call.args[position]
        if not isinstance(arg, ast.Starred) and not any(isinstance(a, ast.Starred) for a in call.args[:position]):
            return arg
    return None

def is_constant(expr: ast.AST | None, value: Any) -> bool:
    return isinstance(expr, ast.Constant) and type(expr.value) is type(value) and expr.value == value


def own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes below a function, class or module, not those of functions, classes or lambdas nested in it."""
    out: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out

def _position(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


# `_position` for statements and expressions the parser made, which always carry both: a sort key in C, for the
# index's sorts of whole buckets (every call, every assignment of a file)
stmt_position = attrgetter("lineno", "col_offset")

def _pairs(target: ast.AST, value: ast.expr) -> Iterator[tuple[str, ast.expr]]:
    if isinstance(target, ast.Name):
        yield target.id, value
    elif isinstance(target, ast.Attribute | ast.Subscript):
        name = dotted(target)
        if name is not None:
            yield name, value
    elif isinstance(target, ast.Tuple | ast.List):
        if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                yield from _pairs(t, v)
        else:
            for t in target.elts:
                if isinstance(t, ast.Starred):
                    t = t.value
                yield from _pairs(t, value)  # each element comes from the same value

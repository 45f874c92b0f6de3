"""What a call of the project's own helper hands back, read in the caller's names.

A checkpoint is often assembled by a helper: `torch.save(training_state(model, optimizer), path)`, or
`state = {**training_state(model, optimizer), "epoch": epoch}` with the helper in another file. A rule that asks
what the saved object holds then needs what the helper returns, said in the caller's terms: `model.state_dict()` in
the helper's body is the caller's `model` that it handed in.

- A function of this file: its `return` expressions, each name of a parameter replaced by the argument the call
  hands to it (by position or keyword). Nothing is parsed again; the file's tree is already there.
- A function of another module of the project (the pre-pass knows the project's modules): its body is not in this
  file, so the objects handed to it stand for what it returns. This is the assumption the checkpoint rule already
  makes of a save helper: it writes what it is handed.
- Anything else (a library call, a method of an object we cannot see) is unknown: None.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.subtree import subtree

if TYPE_CHECKING:
    from torchdoctor.rules.static.index import Index

# Modules whose functions are never the project's own helpers.
_LIBRARIES = frozenset({"torch", "torchvision", "numpy", "np", "os", "shutil", "pickle", "json", "copy", "collections",
                        "accelerate", "transformers", "lightning", "pytorch_lightning", "deepspeed", "wandb", "mlflow",
                        "dataclasses", "typing", "functools", "itertools", "math", "builtins"})


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def _returns(fn: ast.AST) -> list[ast.expr] | None:
    """The values of the function's own `return` statements (not those of functions nested in it); None when one
    returns nothing, so the helper's result is not a single kind of object."""
    found: list[ast.expr] = []
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.Return):
            if node.value is None:
                return None
            found.append(node.value)
        stack.extend(ast.iter_child_nodes(node))
    return found or None


def _handed(fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, method: bool) -> dict[str, ast.expr]:
    """The helper's parameter names -> the caller's expressions handed to them."""
    params = _parameters(fn)
    if method and params:
        params = params[1:]  # `self`
    table: dict[str, ast.expr] = {}
    for name, arg in zip(params, call.args, strict=False):
        if isinstance(arg, ast.Starred):
            break
        table[name] = arg
    for kw in call.keywords:
        if kw.arg is not None:
            table[kw.arg] = kw.value
    return table


def local_helper(index: Index, call: ast.Call) -> tuple[ast.AST, list[ast.expr], dict[str, ast.expr]] | None:
    """(the helper, its return expressions, parameter -> handed expression) for a call of a function or method of
    this file that returns a value on every path; None otherwise."""
    fn = index.local_target(call)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    returned = _returns(fn)
    if returned is None:
        return None
    method = isinstance(call.func, ast.Attribute)
    return fn, returned, _handed(fn, call, method)


def in_callers_terms(expr: ast.expr, handed: dict[str, ast.expr]) -> list[ast.expr]:
    """`model.state_dict()` in the helper, with `model` handed in: the caller's expression for it. An expression
    that reads no parameter stays as it is (a constant, a global of the helper's file)."""
    used = [n.id for n in subtree(expr) if isinstance(n, ast.Name) and n.id in handed]
    if not used:
        return [expr]
    return [handed[name] for name in dict.fromkeys(used)]


def project_helper_args(index: Index, call: ast.Call) -> list[ast.expr] | None:
    """The plain objects (`model`, `self.optimizer`) handed to a function of another module of this project, which
    stand for what it builds from them; None for a call that is not one (a library, a method, an unknown name)."""
    if index.project is None or not isinstance(call.func, ast.Name | ast.Attribute):
        return None
    qualified = index.resolve(call.func) or ""
    module, _, name = qualified.lstrip(".").rpartition(".")
    if not module or not name or module.split(".", 1)[0] in _LIBRARIES or not index.project.has_module(module):
        return None
    args = [a for a in [*call.args, *(k.value for k in call.keywords)]]
    if any(isinstance(a, ast.Starred) for a in args) or any(k.arg is None for k in call.keywords):
        return None
    return [a for a in args if isinstance(a, ast.Name | ast.Attribute)]

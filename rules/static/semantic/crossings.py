"""Where an object crosses into or out of this file: the keys the project pass joins two files' halves by.

A scheduler built in `main.py` and handed to `train(model, loader, optimizer, scheduler)` of `engine.py`, which
steps it every batch, is one object seen from two files, and each file's analysis sees only its half: `main.py`
knows the constructor's arguments, `engine.py` knows the period of the step. So does one built by
`build_scheduler(optimizer, cfg)` of `optim_factory.py` and stepped in `train.py`. Each side describes the crossing
in terms the other can match, and a rule leaves both as facts (`ctx.leave`) for its project pass:

- the receiving side (`arrival`): the name is a parameter of a module-level function of this file (its name,
  the parameter's name and position), or was bound from a call of an imported function (the import's qualified
  name, and the place in a tuple target);
- the giving side (`departures`): an object is handed to a call of an imported function (its qualified name, the
  keyword or position), or is what a module-level function of this file returns (its name, the place in a tuple).

The pass resolves qualified names with `Project.defining` and compares file-local names, so the two sides need
not agree on how the import was spelt. Methods and attributes are left out: a class's `self.x` is joined by the
class analyses of one file.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from torchdoctor.rules.static.semantic.syntax import dotted

if TYPE_CHECKING:
    from torchdoctor.rules.static.index import Index

Crossing = dict[str, Any]


def _module_function(index: Index, fn: ast.AST | None) -> bool:
    return isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and isinstance(index.parent(fn), ast.Module)


def arrival(index: Index, name: str, at: ast.AST) -> Crossing | None:
    """How the object `name` holds at `at` came from another file: as a parameter of the module-level function
    around `at` that nothing in it rebinds first (`{"function": "train", "param": "scheduler", "position": 3}`), or
    bound from a call of an imported function (`{"returned": "optim_factory.build_scheduler", "place": None}`).
    None for anything else, a local object included."""
    if "." in name:
        return None
    fn = index.function_of(at)
    earlier = index.definitions(name, at)
    if earlier:
        value = earlier[-1]
        stmt = next((s for s, v in index.defs(index.scope_of(at)).get(name, []) if v is value), None)
        return _returned_by_import(index, value, name, stmt)
    if fn is None:
        return None
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if _module_function(index, fn) and (name in params or name in [a.arg for a in fn.args.kwonlyargs]):
        return {"function": fn.name, "param": name, "position": params.index(name) if name in params else None}
    # a closure or a nested function reads the enclosing function's binding
    value = index.closure_value(name, at)
    if value is not None:
        return _returned_by_import(index, value, name, None)
    return None


def _returned_by_import(index: Index, value: ast.expr, name: str, stmt: ast.AST | None) -> Crossing | None:
    """`{"returned": qualified, "place": i}` for a value that a call of an imported function gives: the call itself,
    or the i-th element of what it returns when the statement unpacks a tuple (`trn, val = build_loaders(...)`)."""
    place = None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple | ast.List):
        for i, element in enumerate(stmt.targets[0].elts):
            if isinstance(element, ast.Name) and element.id == name:
                place, value = i, stmt.value
    if not isinstance(value, ast.Call) or index.local_target(value) is not None:
        return None
    q = index.resolve(value.func)
    if q is None or "." not in q or q.startswith(("torch.", "transformers.", "timm.")):
        return None
    return {"returned": q, "place": place}


def departures(index: Index, made: ast.Call) -> list[Crossing]:
    """Where the object a constructor call makes leaves this file: handed to calls of imported functions
    (`{"call": "engine.train", "keyword": "scheduler", "position": 3}`), directly or through the name it is bound
    to, or returned by a module-level function of this file (`{"returns": "build_scheduler", "place": None}`)."""
    out: list[Crossing] = []
    parent = index.parent(made)
    out += _handed_to_imports(index, made)
    if isinstance(parent, ast.Return):
        fn = index.function_of(parent)
        if _module_function(index, fn):
            out.append({"returns": fn.name, "place": None})  # type: ignore[union-attr]
        return out
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1):
        return out
    name = dotted(parent.targets[0])
    if name is None or "." in name:
        return out
    fn = index.function_of(parent)
    for node in index.nodes(ast.Name):
        if node.id != name or not isinstance(node.ctx, ast.Load) or index.function_of(node) is not fn:  # type: ignore[attr-defined]
            continue
        holder = index.parent(node)
        if isinstance(holder, ast.Call | ast.keyword):
            out += _handed_to_imports(index, node)
        elif isinstance(holder, ast.Return) and _module_function(index, fn):
            out.append({"returns": fn.name, "place": None})  # type: ignore[union-attr]
        elif isinstance(holder, ast.Tuple) and isinstance(index.parent(holder), ast.Return) and _module_function(index, fn):
            place = next(i for i, e in enumerate(holder.elts) if e is node)
            out.append({"returns": fn.name, "place": place})  # type: ignore[union-attr]
    return out


def _handed_to_imports(index: Index, value: ast.AST) -> list[Crossing]:
    """`value` as an argument of a call of an imported function of the project: its keyword or position."""
    holder = index.parent(value)
    keyword = None
    if isinstance(holder, ast.keyword):
        keyword, holder = holder.arg, index.parent(holder)
    if not isinstance(holder, ast.Call) or holder.func is value or index.local_target(holder) is not None:
        return []
    q = index.resolve(holder.func)
    if q is None or "." not in q or q.startswith(("torch.", "transformers.", "timm.")):
        return []
    position = next((i for i, a in enumerate(holder.args) if a is value), None) if keyword is None else None
    if keyword is None and position is None:
        return []
    return [{"call": q, "keyword": keyword, "position": position}]


def joined(project: Any, arriving_path: str, arriving: Crossing, giving_path: str, leaving: Crossing) -> bool:
    """Whether an object that `leaving` describes in the file at `giving_path` is the one `arriving` describes in
    the file at `arriving_path` (`project` is the project pass's `Project`)."""
    if "function" in arriving and "call" in leaving:
        if not any(f.path == arriving_path and local == arriving["function"] for f, local in project.defining(leaving["call"])):
            return False
        if leaving["keyword"] is not None:
            return leaving["keyword"] == arriving["param"]
        return leaving["position"] is not None and leaving["position"] == arriving["position"]
    if "returned" in arriving and "returns" in leaving:
        return leaving["place"] == arriving["place"] and any(
            f.path == giving_path and local == leaving["returns"] for f, local in project.defining(arriving["returned"]))
    return False

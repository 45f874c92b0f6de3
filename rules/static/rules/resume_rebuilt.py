"""TD709: an optimizer, GradScaler or LR scheduler built again after its state was loaded from a checkpoint.

`optimizer.load_state_dict(ckpt["optimizer"])` fills the object the name holds at that moment. A later
`optimizer = torch.optim.AdamW(...)` (or `scaler = GradScaler()` inside the epoch loop, or a trainer method that
sets `self.optimizer` again after `self.resume()`) binds the name to a fresh object: the loaded moments, loss
scale or schedule position are gone, and the resumed run continues from an empty state while every line of the
resume looks right. The question asked here is one of order on one path: the load of a name, then a constructor
bound to the same name, with no use of the loaded object in between (a use means the first object did work: a
second training stage that builds its own optimizer on purpose).
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.api import Context, rule
from torchdoctor.rules.static.index import Index, dotted, last_name
from torchdoctor.rules.static.semantic.syntax import FUNCTIONS

_KINDS = ("optimizer", "scaler", "scheduler")
_LOAD_WORDS = ("load", "resume", "restore")


@rule("TD709", ast.Module, reads=(ast.Call,))
def state_rebuilt_after_load(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    # Cheap gate: the names this file binds to a constructed optimizer/scaler/scheduler more than zero times,
    # and at least one load of any state in the file. Most files stop here.
    built = {name: [b for b in bs if b.kind in _KINDS and b.call is not None and not b.guessed]
             for name, bs in index.bindings.items()}
    built = {name: bs for name, bs in built.items() if bs}
    if not built or not any(w in ctx.source for w in ("load_", "resume", "restore")):
        return
    calls = _calls(index)
    reported: set[int] = set()
    for name, bindings in built.items():
        loads = _load_points(index, name, calls)
        if not loads:
            continue
        for binding in bindings:
            stmt = binding.node
            if id(stmt) in reported or _positions_schedule(binding):
                continue
            for load in loads:
                if _runs_after(index, load, stmt) and not _used_between(index, name, load, stmt):
                    reported.add(id(stmt))
                    ctx.report(stmt, variable=name, kind=_KIND_WORDS[binding.kind], line=load.lineno)
                    break
        found = _rebuilt_by_method(index, name, bindings, loads, calls[1]) + _rebuilt_where_used(index, name, bindings, loads)
        for stmt, load in found:
            if id(stmt) not in reported:
                reported.add(id(stmt))
                kind = next(b.kind for b in bindings if b.node is stmt)
                ctx.report(stmt, variable=name, kind=_KIND_WORDS[kind], line=load.lineno)


_KIND_WORDS = {"optimizer": "optimizer", "scaler": "GradScaler", "scheduler": "LR scheduler"}


def _calls(index: Index) -> tuple[list[ast.Call], list[ast.Call]]:
    """The file's calls this rule reads, found in one pass: helpers named for loading (`load_checkpoint`,
    `resume`, `restore_state`) and calls of `self.method(...)`."""
    helpers, own = [], []
    for call in index.nodes(ast.Call):
        func = call.func  # type: ignore[attr-defined]
        callee = (last_name(func) or "").lower()
        if callee != "load_state_dict" and any(w in callee for w in _LOAD_WORDS):
            helpers.append(call)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            own.append(call)
    return helpers, own  # type: ignore[return-value]


def _load_points(index: Index, name: str, calls: tuple[list[ast.Call], list[ast.Call]]) -> list[ast.Call]:
    """Calls that fill the object `name` holds with saved state: `name.load_state_dict(...)`, a load helper
    handed it (`load_checkpoint(path, model, optimizer)`, of this file or another), and for `self.x` a call of
    a method of the same class that does one of those (`self.resume(path)`)."""
    found = [c for c in index.method_calls("load_state_dict")
             if dotted(c.func.value) == name]  # type: ignore[attr-defined]
    for call in calls[0]:
        handed = [*call.args, *(k.value for k in call.keywords)]  # type: ignore[attr-defined]
        if any(dotted(a) == name for a in handed) and _helper_loads(index, call):
            found.append(call)  # type: ignore[arg-type]
    if name.startswith("self.") and found:
        methods = {index.function_of(c) for c in found}
        for call in calls[1]:
            target = _method(index, call, call.func.attr)  # type: ignore[attr-defined]
            if target is not None and target in methods and index.function_of(call) is not target:
                found.append(call)
    return found


def _helper_loads(index: Index, call: ast.AST) -> bool:
    """A helper of this file loads state into something (its body calls `load_state_dict`); one of another file
    is taken at its name (`load_checkpoint`, `resume_from`)."""
    func = call.func  # type: ignore[attr-defined]
    fn = index.functions.get(func.id) if isinstance(func, ast.Name) else None
    if fn is None and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        fn = _method(index, call, func.attr)
    if fn is None:
        return not (isinstance(func, ast.Attribute) and dotted(func.value) in ("torch", "self"))
    return any(isinstance(n, ast.Attribute) and n.attr == "load_state_dict" for n in ast.walk(fn))


def _method(index: Index, at: ast.AST, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    info = index.class_of(at)
    return info.method(name) if info is not None else None


def _positions_schedule(binding) -> bool:
    """A scheduler built with `last_epoch=` (yolov5's `scheduler.last_epoch = start_epoch - 1` idiom in the
    constructor) is put back at its position on purpose."""
    return binding.kind == "scheduler" and "last_epoch" in binding.kwargs


def _scope(index: Index, node: ast.AST) -> ast.AST:
    return index.function_of(node) or index.tree


def _runs_after(index: Index, load: ast.AST, stmt: ast.AST) -> bool:
    """The constructor runs after the load on some path of the same function: it comes later in the text, and
    is not on the other branch of an `if` the load sits in, nor in the `except` of a `try` that holds the load
    (a fallback when the load failed)."""
    if _scope(index, load) is not _scope(index, stmt):
        return False
    if (stmt.lineno, stmt.col_offset) <= (load.lineno, load.col_offset):  # type: ignore[attr-defined]
        return False
    load_path = _path(index, load)
    for anc, field in _path(index, stmt).items():
        other = load_path.get(anc)
        if other is None or other == field:
            continue
        if isinstance(anc, ast.If) and {other, field} == {"body", "orelse"}:
            return False
        if isinstance(anc, ast.Try) and other == "body" and field == "handlers":
            return False
    return True


def _path(index: Index, node: ast.AST) -> dict[ast.AST, str]:
    """The compound statements around `node` in its function, each with the field (`body`, `orelse`,
    `handlers`) that holds it."""
    out: dict[ast.AST, str] = {}
    child = node
    for anc in index.ancestors(node):
        if isinstance(anc, (*FUNCTIONS, ast.ClassDef, ast.Module)):
            break
        for field in ("body", "orelse", "handlers", "finalbody"):
            block = getattr(anc, field, None)
            if isinstance(block, list) and child in block:
                out[anc] = field
                break
        child = anc
    return out


def _used_between(index: Index, name: str, load: ast.AST, stmt: ast.AST) -> bool:
    """The loaded object is read between the load and the new constructor (stepped, handed on, stored): it did
    work, and the rebuild starts a new stage rather than discarding a resume."""
    start = (getattr(load, "end_lineno", load.lineno), getattr(load, "end_col_offset", 0))  # type: ignore[attr-defined]
    end = (stmt.lineno, stmt.col_offset)  # type: ignore[attr-defined]
    load_stmt = index.statement_of(load)
    for sub in ast.walk(_scope(index, load)):
        if isinstance(sub, ast.Name | ast.Attribute) and isinstance(sub.ctx, ast.Load) and dotted(sub) == name:
            here = (sub.lineno, sub.col_offset)
            if start < here < end and index.statement_of(sub) is not load_stmt:
                return True
    return False


def _rebuilt_by_method(index: Index, name: str, bindings: list, loads: list[ast.Call],
                       own: list[ast.Call]) -> list[tuple[ast.AST, ast.Call]]:
    """`self.resume(path)` then `self.build_optimizer()` in one method, where the second method sets
    `self.optimizer = ...` again: the rebuild is reported in the method that does it."""
    if not name.startswith("self."):
        return []
    by_method: dict[ast.AST, ast.AST] = {}
    for b in bindings:
        fn = index.function_of(b.node)
        if fn is not None:
            by_method.setdefault(fn, b.node)
    if not by_method:
        return []
    out = []
    for call in own:
        target = _method(index, call, call.func.attr)  # type: ignore[attr-defined]
        if target is None or target not in by_method:
            continue
        for load in loads:
            if _runs_after(index, load, call) and not _used_between(index, name, load, call):
                out.append((by_method[target], load))
                break
    return out


def _rebuilt_where_used(index: Index, name: str, bindings: list, loads: list[ast.Call]) -> list[tuple[ast.AST, ast.Call]]:
    """A class whose every method that works with `self.x` builds it afresh first (`def fit(self): self.scaler =
    GradScaler(); for batch in ...: self.scaler.scale(loss)`), while another method loads state into it
    (`def load_checkpoint(self, path): self.scaler.load_state_dict(...)`): whenever the load runs before the
    training method, as a resume must, its state is replaced; run after, nothing reads it. composer's trainer
    (#1376) built its GradScaler in `_train_loop` after `__init__` had loaded the checkpoint."""
    if not name.startswith("self."):
        return []
    info = index.class_of(loads[0])
    if info is None:
        return []
    # The methods that load themselves (not those that only call one: their own uses of the object count)
    load_methods = {index.function_of(c) for c in loads if not _calls_own_method(c)}
    rebuilt: dict[ast.AST, ast.AST] = {}
    for b in bindings:
        fn = index.function_of(b.node)
        if fn is not None and fn.name != "__init__" and index.class_of(b.node) is not None \
                and index.class_of(b.node).node is info.node and fn not in load_methods:  # type: ignore[union-attr]
            rebuilt.setdefault(fn, b.node)
    if not rebuilt:
        return []
    attr = name.split(".", 1)[1]
    for method in info.methods.values():
        if method in load_methods:
            continue
        uses = [n for n in ast.walk(method) if isinstance(n, ast.Attribute) and n.attr == attr
                and isinstance(n.ctx, ast.Load) and dotted(n) == name and not _saved_only(index, n)]
        if not uses:
            continue
        first = rebuilt.get(method)
        if first is None or any((u.lineno, u.col_offset) < (first.lineno, first.col_offset) for u in uses):  # type: ignore[attr-defined]
            return []  # a method works with whatever object is there, the loaded one included
        if any(called in load_methods for called in _own_calls(method, info)):
            return []  # the training method loads (or resumes) itself after building
    load = loads[0]
    return [(stmt, load) for stmt in rebuilt.values()]


def _own_calls(fn: ast.AST, info) -> list[ast.AST]:
    """The methods of the class that `fn` calls as `self.name(...)`."""
    out = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                and n.func.value.id == "self":
            target = info.method(n.func.attr)
            if target is not None:
                out.append(target)
    return out


def _saved_only(index: Index, node: ast.AST) -> bool:
    """`self.scaler.state_dict()` (a checkpoint being written) reads the object without working with it."""
    parent = index.parent(node)
    return isinstance(parent, ast.Attribute) and parent.attr in ("state_dict", "load_state_dict")


def _calls_own_method(call: ast.Call) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
        and "load_state_dict" != func.attr

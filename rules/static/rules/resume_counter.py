"""TD710: a resume that restores the optimizer from a checkpoint but never reads back the epoch or step counter
the same file writes into it.

The save writes `{"model": ..., "optimizer": ..., "epoch": epoch}`; the resume loads that file and restores the
model and the optimizer, so it means to continue the run; but the counter that bounds the loop (`for epoch in
range(epochs)`, `while step < max_steps`) starts again at its constant. The resumed run repeats every epoch it
had done, with a learning-rate schedule keyed to the counter replayed from the start and an optimizer whose state
is that of the end. The question is asked of one loaded checkpoint at a time: the dict `torch.load` returned must
be read only by constant keys in this file (nothing hands it on, nothing reads a key we cannot see), so a key it
never reads is known not to be restored from it.
"""

from __future__ import annotations

import ast
import re

from torchdoctor.rules.static.api import Context, rule
from torchdoctor.rules.static.index import Index, dotted, last_name
from torchdoctor.rules.static.rules.checkpointing import _value_used

_COUNTER_KEY = re.compile(r"^(?:start_|last_|cur_|current_|global_|total_)?(?:epoch|step|iter|iteration|it|n_iter|"
                          r"num_steps|steps|epochs|iters|iterations)s?$", re.IGNORECASE)
_ANY_COUNTER = re.compile(r"epoch|iter|step", re.IGNORECASE)
_RESTORED_KINDS = ("optimizer", "scaler", "scheduler")


@rule("TD710", ast.Module, reads=(ast.Call,))
def counter_not_restored(node: ast.Module, ctx: Context) -> None:
    # Cheap gate: a file that both saves and loads with torch (most files do neither).
    if "torch.load" not in ctx.source or "save" not in ctx.source or "load_state_dict" not in ctx.source:
        return
    index = ctx.index
    saved = _saved_counters(index)
    if not saved:
        return
    every = saved.pop("__all__")
    for call in index.nodes(ast.Call):
        if index.callee(call) != "torch.load":  # type: ignore[arg-type]
            continue
        stmt = index.statement_of(call)
        if not (isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            continue
        reads = _keys_read(index, stmt.targets[0].id, stmt)
        if reads is None or not (set(reads) & every):
            continue  # handed on, or not the checkpoint this file writes
        for key, counter in saved.items():
            if any(_value_used(index, read) for read in reads.get(key, [])):
                continue  # restored
            if not (_restores_optimizer(index, stmt.targets[0].id, stmt) or _other_counter_restored(index, reads, key)):
                continue  # a load of weights (fine-tuning, evaluation), not a resume
            restart = _restarts(index, counter)
            if restart is not None:
                at = restart if isinstance(restart, ast.For) else stmt
                ctx.report(at, variable=dotted(counter) or key, key=key, line=stmt.lineno)
                return


def _other_counter_restored(index: Index, reads: dict[str, list[ast.AST]], key: str) -> bool:
    """Another counter of the checkpoint is read back and used (`model.Eiters = checkpoint["Eiters"]`): the load
    continues a run, although the key asked about is not restored."""
    return any(other != key and _ANY_COUNTER.search(other) and any(_value_used(index, r) for r in nodes)
               for other, nodes in reads.items())


def _saved_counters(index: Index) -> dict:
    """The counters torch.save writes under a counter key of a dict literal (`"epoch": epoch`, `"step":
    self.step`), key -> the counter's expression; `"__all__"` holds every key those dicts write."""
    found: dict = {}
    every: set[str] = set()
    for call in index.nodes(ast.Call):
        if not call.args or "save" not in (last_name(call.func) or "").lower():  # type: ignore[attr-defined]
            continue  # torch.save, or a save helper handed the dict (`save_checkpoint({...}, is_best)`)
        obj = call.args[0]  # type: ignore[attr-defined]
        if isinstance(obj, ast.Name):
            values = index.definitions(obj.id, call)
            obj = values[-1] if values else obj
        if not isinstance(obj, ast.Dict):
            continue
        for k, v in zip(obj.keys, obj.values, strict=True):
            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                every.add(k.value)
                counter = v.left if isinstance(v, ast.BinOp) else v  # `"epoch": epoch + 1`
                if _COUNTER_KEY.match(k.value) and isinstance(counter, ast.Name | ast.Attribute) and dotted(counter):
                    found.setdefault(k.value, counter)
    if found:
        found["__all__"] = every
    return found


def _keys_read(index: Index, name: str, stmt: ast.AST) -> dict[str, list[ast.AST]] | None:
    """Every key read from the loaded dict, with its reads, when each read is `ckpt["key"]`, `ckpt.get("key")` or
    `"key" in ckpt`; None when the dict goes anywhere we cannot follow (handed to a function, returned,
    iterated, read by a variable key, bound again)."""
    scope = index.function_of(stmt) or index.tree
    keys: dict[str, list[ast.AST]] = {}
    for sub in ast.walk(scope):
        if not (isinstance(sub, ast.Name) and sub.id == name) or sub is stmt.targets[0]:  # type: ignore[attr-defined]
            continue
        if isinstance(sub.ctx, ast.Store):
            return None
        parent = index.parent(sub)
        if isinstance(parent, ast.Subscript) and parent.value is sub:
            if not (isinstance(parent.slice, ast.Constant) and isinstance(parent.slice.value, str)):
                return None
            keys.setdefault(parent.slice.value, []).append(parent)
        elif isinstance(parent, ast.Attribute) and parent.attr == "get":
            call = index.parent(parent)
            if not (isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant)
                    and isinstance(call.args[0].value, str)):
                return None
            keys.setdefault(call.args[0].value, []).append(call)
        elif isinstance(parent, ast.Compare) and sub in parent.comparators:
            if isinstance(parent.left, ast.Constant) and isinstance(parent.left.value, str):
                keys.setdefault(parent.left.value, [])
        else:
            return None
    return keys


def _restores_optimizer(index: Index, name: str, stmt: ast.AST) -> bool:
    """The loaded dict goes into an optimizer, scaler or scheduler (`optimizer.load_state_dict(ckpt[...])`): a
    resume, not a load of weights for fine-tuning or evaluation."""
    scope = index.function_of(stmt) or index.tree
    for call in index.method_calls("load_state_dict"):
        if (index.function_of(call) or index.tree) is not scope or not call.args:  # type: ignore[attr-defined]
            continue
        arg = call.args[0]  # type: ignore[attr-defined]
        receiver = call.func.value  # type: ignore[attr-defined]
        if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name) and arg.value.id == name \
                and (index.kind_of(receiver) in _RESTORED_KINDS or "optim" in (dotted(receiver) or "").lower()):
            return True
    return False


def _restarts(index: Index, counter: ast.AST) -> ast.AST | None:
    """Where the counter starts from a constant on every run, when it bounds the training: the `for` over
    `range(constant, ...)` it is the variable of, or (for a name / `self.x` only ever set to constants and stepped,
    `step += 1`, read in a comparison or a `range()`: a stop condition, a loop bound) its first assignment."""
    name = dotted(counter)
    if name is None:
        return None
    assigned: list[ast.AST] = []
    loop: ast.AST | None = None
    bounded = False
    for sub in ast.walk(index.tree):
        if isinstance(sub, ast.For) and dotted(sub.target) == name:
            it = sub.iter
            if not (isinstance(it, ast.Call) and dotted(it.func) == "range" and it.args):
                return None
            if len(it.args) > 1 and not isinstance(it.args[0], ast.Constant):
                return None  # `range(start_epoch, epochs)`: started from something we do not follow
            bounded, loop = True, loop or sub
        elif isinstance(sub, ast.Assign | ast.AnnAssign):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            if any(dotted(t) == name for t in targets):
                assigned.append(sub)
            elif any(isinstance(t, ast.Tuple) and any(dotted(e) == name for e in t.elts) for t in targets):
                return None  # `model, epoch = load(...)`: bound from something we do not follow
        elif isinstance(sub, ast.Compare) and any(dotted(x) == name for x in (sub.left, *sub.comparators)):
            bounded = True
        elif isinstance(sub, ast.Call) and dotted(sub.func) == "range" and any(dotted(a) == name for a in sub.args):
            bounded = True
    if any(not isinstance(a.value, ast.Constant) for a in assigned if a.value is not None):  # type: ignore[attr-defined]
        return None
    if not bounded:
        return None
    # a counter we saw start (not `for i, batch in enumerate(...)`)
    return loop or (min(assigned, key=lambda a: (a.lineno, a.col_offset)) if assigned else None)  # type: ignore[attr-defined]

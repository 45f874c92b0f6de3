"""TD7xx — checkpointing: what a training checkpoint holds, how it is loaded (weights_only,
map_location), whole pickled modules and ignored strict=False mismatches. Docs: checkpointing.toml."""

from __future__ import annotations

import ast
import re

from torchdoctor.rules.static.api import Context, project, rule
from torchdoctor.rules.static.callcontext import call_context, leave_sites
from torchdoctor.rules.static.index import (
    Index,
    Loop,
    dotted,
    is_constant,
    is_eval_word,
    kwarg,
    last_name,
    looks_like_model,
)
from torchdoctor.rules.static.patterns import latest_value
from torchdoctor.rules.static.project import Project, ProjectHit
from torchdoctor.rules.static.rules.mixed_precision import _exclusive
from torchdoctor.rules.static.rules.profiling import names_a_gpu, snippet
from torchdoctor.rules.static.semantic import helperreturns
from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import _position

_COUNTER = re.compile(r"epoch|step|iter", re.I)


# -- what a torch.save call writes -----------------------------------------------------------


def _subscript_stores(ctx: Context) -> dict[tuple[ast.AST, str], list[tuple[ast.stmt, str | None, ast.expr]]]:
    """`state["optimizer"] = ...` statements, by (scope, container name)."""
    index = ctx.index

    def build():
        table: dict[tuple[ast.AST, str], list[tuple[ast.stmt, str | None, ast.expr]]] = {}
        for stmt in index.nodes(ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Subscript):
                    name = dotted(target.value)
                    if name is None:
                        continue
                    key = target.slice.value if isinstance(target.slice, ast.Constant) else None
                    table.setdefault((index.scope_of(stmt), name), []).append(
                        (stmt, key if isinstance(key, str) else None, stmt.value)
                    )
        return table

    return ctx.memo("checkpointing:subscript-stores", build)


def saved_contents(ctx: Context, expr: ast.AST | None, at: ast.AST, depth: int = 0) -> tuple[list[ast.AST], list[str]] | None:
    """(expressions, string keys) a saved object is built from, or None when we cannot see it."""
    index = ctx.index
    if expr is None or depth > 4:
        return None
    if isinstance(expr, ast.Dict):
        values: list[ast.AST] = []
        keys: list[str] = []
        for k, v in zip(expr.keys, expr.values, strict=True):
            if k is None:  # `{**base, "epoch": epoch}`: what the spread dict holds is saved too
                spread = saved_contents(ctx, v, at, depth + 1)
                if spread is None:
                    return None  # a spread we cannot read may hold anything
                values += spread[0]
                keys += spread[1]
                continue
            values.append(v)
            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                keys.append(k.value)
        return values, keys
    if isinstance(expr, ast.Call):
        if isinstance(expr.func, ast.Name) and expr.func.id == "dict" and not expr.args:
            if any(kw.arg is None for kw in expr.keywords):
                return None
            return [kw.value for kw in expr.keywords], [kw.arg for kw in expr.keywords if kw.arg]
        if isinstance(expr.func, ast.Attribute) and expr.func.attr == "state_dict":
            return [expr], []
        if not expr.args and expr.keywords and all(kw.arg for kw in expr.keywords) \
                and (last_name(expr.func) or "")[:1].isupper() \
                and _kinds_in(index, [kw.value for kw in expr.keywords]) & {"module", "optimizer"}:
            # a record built by keyword (lightly-train's `TrainTaskState(train_model=..., optimizer=..., step=-1)`,
            # a TypedDict or dataclass that Fabric saves): its fields are the checkpoint's keys
            return [kw.value for kw in expr.keywords], [kw.arg for kw in expr.keywords if kw.arg]
        return _helper_contents(ctx, expr, depth)
    if isinstance(expr, ast.Name):
        value = latest_value(index, expr.id, at)
        found = saved_contents(ctx, value, value, depth + 1) if value is not None else None
        if found is None:
            return None
        values, keys = list(found[0]), list(found[1])
        stmt = index.statement_of(at)
        here = (stmt.lineno, stmt.col_offset) if stmt is not None else (1 << 30, 0)
        for s, key, value in _subscript_stores(ctx).get((index.scope_of(at), expr.id), []):
            if (s.lineno, s.col_offset) < here:
                values.append(value)
                if key:
                    keys.append(key)
        for call in index.method_calls("update"):
            if dotted(call.func.value) == expr.id and index.scope_of(call) is index.scope_of(at) and call.lineno < here[0]:  # type: ignore[attr-defined]
                values += list(call.args) + [kw.value for kw in call.keywords]
                keys += [kw.arg for kw in call.keywords if kw.arg]
                for arg in call.args:
                    if isinstance(arg, ast.Dict):
                        keys += [k.value for k in arg.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        return values, keys
    return None


def _helper_contents(ctx: Context, call: ast.Call, depth: int) -> tuple[list[ast.AST], list[str]] | None:
    """What a helper of the project returns when it builds the saved object (`training_state(model, optimizer)`),
    in the caller's names (helperreturns.py): a helper of this file is read through its `return`s; one of another
    module stands for the objects handed to it, when a model or an optimizer is among them (a helper handed only
    paths or numbers builds no training state we could name)."""
    index = ctx.index
    local = helperreturns.local_helper(index, call)
    if local is not None:
        fn, returned, handed = local
        values: list[ast.AST] = []
        keys: list[str] = []
        for value in returned:
            found = saved_contents(ctx, value, value, depth + 1)
            if found is None:
                return None  # one path returns something we cannot read
            for v in found[0]:
                values += helperreturns.in_callers_terms(v, handed)  # type: ignore[arg-type]
            keys += found[1]
        return values, keys
    handed_args = helperreturns.project_helper_args(index, call)
    if not handed_args or not _kinds_in(index, handed_args) & {"module", "optimizer"}:  # type: ignore[arg-type]
        return None
    return list(handed_args), [k.arg for k in call.keywords if k.arg]


def _kinds_in(index: Index, values: list[ast.AST]) -> set[str]:
    kinds: set[str] = set()
    for value in values:
        for node in ast.walk(value):
            if isinstance(node, ast.Name | ast.Attribute):
                kind = index.kind_of(node)
                if kind:
                    kinds.add(kind)
    return kinds


def _names_in(values: list[ast.AST]) -> set[str]:
    return {n.id for v in values for n in ast.walk(v) if isinstance(n, ast.Name)}


def _optimizer_name(index: Index, model: str | None = None) -> str | None:
    """The optimizer of `model` (built from its parameters) when there are several, else the one stepped."""
    if model:
        root = model.split(".")[0]
        for b in index.bindings_of("optimizer"):
            if b.call is not None and b.call.args and any(
                isinstance(n, ast.Name) and n.id == root for n in ast.walk(b.call.args[0])
            ):
                return b.name
    for call in index.step_calls:
        receiver = call.func.value  # type: ignore[attr-defined]
        if index.kind_of(receiver) == "optimizer":
            return dotted(receiver)
        if call.args and index.kind_of(call.args[0]) == "optimizer":
            return dotted(call.args[0])
    found = index.bindings_of("optimizer")
    return found[0].name if found else None


def _stateless(index: Index, optimizer: str) -> bool:
    """Plain SGD without momentum keeps no per-parameter state: its state_dict adds nothing."""
    b = index.binding(optimizer) or index.binding(optimizer.rsplit(".", 1)[-1])
    if b is None or b.cls != "torch.optim.SGD" or b.star_kwargs:
        return False
    momentum = b.arg("momentum", 2)
    return momentum is None or (isinstance(momentum, ast.Constant) and momentum.value == 0)


def _rebuilt_each_pass(index: Index, optimizer: str, model: str | None, loop: Loop) -> bool:
    """The optimizer is built afresh by a statement of the loop's own body while the model it trains lives on
    (AttnGAN's `pretrain_DAMSM.py`: `optimizer = optim.Adam(...)` at the top of every epoch): its state never outlives
    a pass, so a checkpoint written in that loop without it resumes the way the run itself goes on. Built under a
    condition or in an outer loop, it carries state between the saves; with the model built in the same body, each
    pass is a run of its own that a load may continue (a seeds loop), and the optimizer is still asked for."""
    body = loop.node.body
    if model and any(b.node in body for b in index.bindings.get(model, ())):
        return False
    return any(b.kind == "optimizer" and b.node in body for b in index.bindings.get(optimizer, ()))


def _gone_at(index: Index, name: str, anchor: ast.AST) -> bool:
    """The object is a local of a function the checkpoint is not written from (`def train(self, examples):
    optimizer = optim.Adam(...)` in a wrapper whose `save_checkpoint()` another caller runs): a fresh one is built
    on every call and it is gone when the save runs, so there is no state of it to save or to resume."""
    if "." in name:
        return False
    built = index.bindings.get(name)
    if not built:
        return False
    for fn in index.ancestors(anchor):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and (
                name in {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
                or any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(fn))):
            return False  # also a name of the function the save runs from (`optimizerG, optimizersD = self.define_optimizers(...)`)
    for b in built:
        fn = index.function_of(b.node)
        if fn is None or isinstance(b.node, ast.FunctionDef | ast.AsyncFunctionDef | ast.arguments | ast.arg):
            return False  # a global, or a parameter: a caller may keep it
        if any(a is fn for a in index.ancestors(anchor)):
            return False  # alive where the checkpoint is written
    return True


def _used_binding(index: Index, kind: str, method: str) -> str | None:
    """The name of a `kind` object whose `.method()` the file calls (`scheduler.step()`, `scaler.scale()`)."""
    for call in index.method_calls(method):
        receiver = call.func.value  # type: ignore[attr-defined]
        b = index.binding(receiver)
        if b is not None and b.kind == kind and not _disabled(b):
            return dotted(receiver)
    return None


def _disabled(b) -> bool:
    """`GradScaler(enabled=False)`: a scaler that never scales keeps no state worth saving (co-tracker's
    train_on_kubric.py)."""
    enabled = b.arg("enabled") if b.call is not None else None
    return is_constant(enabled, False)


def _built_here(index: Index, name: str | None) -> bool:
    """The object is constructed in this file (not a parameter handed in, whose position a caller may restore)."""
    b = index.binding(name) if name else None
    return b is not None and not isinstance(b.node, ast.FunctionDef | ast.AsyncFunctionDef | ast.arguments | ast.arg)


def _handed_to_training(index: Index, kind: str) -> str | None:
    """A `kind` object the training loop hands to the code that trains (`train_one_epoch(..., loss_scaler, ...)`)
    or calls itself (`loss_scaler(loss, optimizer)`, timm's NativeScaler): it is in use even when its own methods
    are called in another file."""
    for loop in index.training_loops():
        for call in loop.all_calls():
            for expr in [call.func, *call.args, *(k.value for k in call.keywords)]:
                b = index.binding(expr) if isinstance(expr, ast.Name | ast.Attribute) else None
                if b is not None and b.kind == kind:
                    return dotted(expr)
    return None


def _evaluation_export(index: Index, node: ast.Call, path: ast.AST | None) -> bool:
    """Weights written for an evaluation, not to resume from: the save is made by an evaluation function
    (`def do_test(cfg, model, it): torch.save({"teacher": sd}, eval_path)`), or the file is handed to one right
    after (`torch.save(q.state_dict(), model_path)`, then `evaluate(model_path, ...)`)."""
    fn = index.function_of(node)
    if fn is not None and is_eval_word(getattr(fn, "name", "")) and fn not in index.training_functions:
        return True
    name = dotted(path) if isinstance(path, ast.Name | ast.Attribute) else None
    if name is None:
        return False
    for call in index.calls_in(fn):  # fn None: the module's own statements (`if __name__ == "__main__":`)
        if call.lineno > node.lineno and is_eval_word(last_name(call.func)) \
                and any(dotted(a) == name for a in [*call.args, *(k.value for k in call.keywords)]):
            return True
    return False


def _progress_test(compare: ast.Compare, loop: Loop) -> bool:
    """`i_batch >= len(train_loader) - 1`, `step > warmup_steps`: a comparison of how far the loop has got (a
    loop variable, a counter, a length), not of how good the model is."""
    names = [n for n in ast.walk(compare) if isinstance(n, ast.Name | ast.Attribute)]
    targets = set()
    lp: Loop | None = loop
    while lp is not None:
        targets.update(lp.targets)
        lp = lp.parent
    return any(isinstance(n, ast.Call) and last_name(n.func) == "len" for n in ast.walk(compare)) or any(
        dotted(n) in targets or _COUNTER.search(last_name(n) or "") for n in names)


def _best_model_export(index: Index, node: ast.AST, loop: Loop) -> bool:
    """`if val_acc > best: torch.save(model.state_dict(), "best.pt")`: a weights export, not a resume point."""
    for anc in index.ancestors(node):
        if anc is loop.node:
            break
        if isinstance(anc, ast.If):
            tests = list(ast.walk(anc.test))
            compares = any(
                isinstance(n, ast.Compare) and any(isinstance(op, ast.Lt | ast.Gt | ast.LtE | ast.GtE) for op in n.ops)
                and not _progress_test(n, loop)
                for n in tests
            )
            periodic = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in tests)
            if compares and not periodic:
                return True
            if any(isinstance(n, ast.Name | ast.Attribute) and "best" in (dotted(n) or "").lower() for n in tests):
                return True
    return False


def _training_loop_for_save(index: Index, node: ast.Call) -> tuple[Loop, ast.AST, bool] | None:
    """(loop, anchor, direct): the training loop a save runs in, directly or through one local function call,
    or the one its trainer class trains in when the class reads that file back (`_trainer_class_checkpoint`)."""
    loop = index.training_loop_of(node)
    if loop is not None:
        return loop, node, True
    fn = index.function_of(node)
    if fn is None:
        return None
    for call in index.callers(fn):
        outer = index.training_loop_of(call)
        if outer is not None:
            return outer, call, False
    return _trainer_class_checkpoint(index, node)


def _accelerators(index: Index) -> set[str]:
    """Names bound to an `accelerate.Accelerator(...)`."""
    names: set[str] = set()
    for call in index.calls_to("accelerate.Accelerator"):
        stmt = index.parent(call)
        if isinstance(stmt, ast.Assign) and stmt.value is call:
            names.update(d for d in (dotted(t) for t in stmt.targets) if d)
    return names


def _prepared(index: Index, accelerator: str) -> list[ast.AST]:
    """What an Accelerator was handed to track: `prepare(model, optimizer, ...)` and `register_for_checkpointing`."""
    out: list[ast.AST] = []
    for method in ("prepare", "register_for_checkpointing"):
        for call in index.method_calls(method):
            if dotted(call.func.value) == accelerator:  # type: ignore[attr-defined]
                out += [a for a in call.args if isinstance(a, ast.Name | ast.Attribute)]
    return out


def _trainer_class_checkpoint(index: Index, node: ast.Call) -> tuple[Loop, ast.AST, bool] | None:
    """A trainer class whose save method writes a file another of its methods loads back, and which steps an
    optimizer in a training loop of its own (end-to-end-SLU's `Trainer`: `save_checkpoint()` and `load_checkpoint()`
    around `model_state.pth`, `train()` stepping `self.optimizer`): that pair is the class's resume, whoever calls
    it from another file between epochs. (loop, anchor, direct) as for a save in the loop, never direct."""
    info = index.class_of(node)
    path = kwarg(node, "f", 1)
    if info is None or info.is_module or path is None:
        return None
    if _reader_in_class(index, node, info) is None:
        return None
    for loop in index.training_loops():
        owner = index.class_of(loop.node)
        if owner is not None and owner.node is info.node and loop.has_step:
            return loop, node, False
    return None


def _reader_in_class(index: Index, node: ast.Call, info) -> ast.Call | None:
    """The `torch.load` of another method of the save's class that reads the file the save writes. A path that is
    a bare parameter on either side (`def _save(optimizer, path)` / `def _load(optimizer, path)`) names whatever
    the callers hand in: the same spelling says nothing about the same file."""
    path = kwarg(node, "f", 1)
    here = index.function_of(node)
    if path is None or _bare_parameter(index, path):
        return None
    mine = _path_words(path)
    best: tuple[int, ast.Call] | None = None
    for c in index.calls_to("torch.load"):
        owner = index.class_of(c)
        other = kwarg(c, "f", 0)
        if owner is None or owner.node is not info.node or index.function_of(c) is here or other is None:
            continue
        # the same file: the same form, and a word of it in common (`OPTIMIZER_NAME`, "model_state.pth"), so that
        # `join(output_dir, OPTIMIZER_NAME)` is not read back by `join(checkpoint, WEIGHTS_NAME)`
        shared = len(mine & _path_words(other))
        if shared and not _bare_parameter(index, other) and _same_path(index, other, path) and (
                best is None or shared > best[0]):
            best = (shared, c)
    return best[1] if best is not None else None


def _path_words(expr: ast.AST) -> set[str]:
    """The names and literal text a path expression is built from, less `os.path.join` and `self`."""
    words: set[str] = set()
    for n in ast.walk(expr):
        if isinstance(n, ast.Name) and n.id not in ("os", "self"):
            words.add(n.id)
        elif isinstance(n, ast.Attribute) and n.attr not in ("path", "join"):
            words.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.strip("/"):
            words.add(n.value)
    return words


def _bare_parameter(index: Index, expr: ast.AST) -> bool:
    fn = index.function_of(expr)
    return isinstance(expr, ast.Name) and fn is not None and expr.id in {
        a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}  # type: ignore[attr-defined]


@rule("TD701", ast.Module)
def checkpoint_without_training_state(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    # Saves written in the loop itself come first: when a group of saves is one finding, it points at one of them.
    writes = [*_save_calls(index), *_framework_saves(index), *_helper_writes(ctx)]
    saves = sorted(dict.fromkeys(writes), key=lambda c: index.training_loop_of(c) is None)
    for call in saves:
        _checkpoint_without_training_state(call, ctx)
    _leave_checkpoint_facts(ctx)


def _leave_checkpoint_facts(ctx: Context) -> None:
    """For the project pass: module-level functions that write a checkpoint of a model with no optimizer state
    and take no optimizer (snowfall's `save_checkpoint(filename, model, epoch, ...)` in a library module), and
    training loops that call a function of another module while an optimizer steps and the script resumes."""
    index = ctx.index
    for call in _save_calls(index):
        fn = index.function_of(call)
        if fn is None or not isinstance(index.parent(fn), ast.Module) or index.training_loop_of(call) is not None:
            continue
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
        if any(_OPTIM_WORD.search(p) for p in params):
            continue  # the caller hands the optimizer in
        obj = kwarg(call, "obj", 0)
        contents = saved_contents(ctx, obj, call)
        if contents is None:
            continue
        values, keys = contents
        if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "state_dict"
                   for v in values for n in ast.walk(v)):
            continue  # not a checkpoint of a model
        if any(_OPTIM_WORD.search(k) for k in keys) or "optimizer" in _kinds_in(index, values):
            continue
        ctx.leave("saves-without-optimizer", {"function": fn.name, "line": call.lineno, "col": call.col_offset + 1,
                                              "variable": snippet(ctx, obj, 40) if obj is not None else "..."})
    optimizer = _optimizer_name(index)
    if optimizer is None or not _resumes(ctx):
        return
    for loop in index.training_loops():
        for call in loop.calls:
            q = index.resolve(call.func)
            if q is None or "." not in q or q.split(".", 1)[0] in ("torch", "torchvision", "numpy", "np", "os"):
                continue
            if any(_OPTIM_WORD.search(dotted(a) or "") for a in [*call.args, *(k.value for k in call.keywords)]):
                continue  # the optimizer goes with it
            where = f"the loop over `{loop.source}`" if loop.source else f"the training loop at line {loop.line}"
            ctx.leave("trains-and-calls", {"callee": q, "optimizer": optimizer, "loop": where, "line": call.lineno})


_OPTIM_WORD = re.compile(r"optim", re.I)


@project("TD701")
def checkpoint_without_optimizer_across_files(project: Project) -> list[ProjectHit]:
    """train.py resumes (start_epoch, load_checkpoint) and, in its epoch loop, calls `common.save_checkpoint(...)`,
    whose body (common.py) writes the model and the epoch but no optimizer state."""
    writers = {(f.module, fact["function"]): (f, fact) for f, fact in project.facts("saves-without-optimizer")}
    if not writers:
        return []
    hits: dict[tuple[str, int], ProjectHit] = {}
    for f, fact in project.facts("trains-and-calls"):
        for g, name in project.defining(fact["callee"]):
            if (g.module, name) not in writers or g is f:
                continue
            w = writers[(g.module, name)][1]
            optimizer = fact["optimizer"]
            hits.setdefault((g.path, w["line"]), ProjectHit(g.path, w["line"], w["col"], {
                "variable": w["variable"], "write": f"torch.save({w['variable']})", "missing": ["optimizer"],
                "missing_text": f"the optimizer state (`{optimizer}.state_dict()`)",
                "loop": f"{fact['loop']} of {f.path} (line {fact['line']})",
                "suggestion": f'{{..., "optimizer": {optimizer}.state_dict()}} (hand `{optimizer}` to `{name}`)'}))
    return list(hits.values())


def _save_calls(index: Index) -> list[ast.Call]:
    """`torch.save(obj, f)`, and the wrappers that pass the same arguments to it on the main process
    (`utils.save_on_master({...}, path)`, vocabulary.toml save_wrappers)."""
    calls = list(index.calls_to("torch.save"))
    wrappers = index.names["save_wrappers"]
    calls += [c for key, found in index.calls_by_name.items() if key.rsplit(".", 1)[-1] in wrappers
              for c in found if c.args]
    return list(dict.fromkeys(calls))


def _framework_writer(index: Index, call: ast.Call) -> list | None:
    """The [object keyword, position, path keyword, position] of a framework checkpoint write (vocabulary.toml
    checkpoint_writers): `fabric.save(path, state)` on a `Fabric(...)`, `self.save(content, filepath)` in a
    `LightningLite` subclass (co-tracker's `Lite.run`)."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "save"):
        return None
    writers = index.vocab["checkpoint_writers"]
    receiver = func.value
    if isinstance(receiver, ast.Name) and receiver.id == "self":
        info = index.class_of(call)
        return next((writers[b] for b in (info.bases if info is not None else []) if b in writers), None)
    name = dotted(receiver)
    value = latest_value(index, name, call) if name else None
    if isinstance(value, ast.Call):
        return writers.get(index.resolve(value.func) or "")
    return None


def _framework_saves(index: Index) -> list[ast.Call]:
    if "save" not in index.calls_by_method:
        return []
    return [c for c in index.method_calls("save") if _framework_writer(index, c) is not None]


def _helper_writes(ctx: Context) -> list[ast.Call]:
    """Calls of a checkpoint helper of the project (`save_classifier(model, dir, epoch, stats, optim, scheduler)`,
    `helpers.save_checkpoint(fabric=fabric, out_dir=out_dir, state=state)`) that are handed the optimizer, or a
    state container holding it: the helper writes what it is handed, so those arguments are the checkpoint.
    Not torch's, a framework's or a save wrapper's (those are read as they are)."""
    index = ctx.index
    found: list[ast.Call] = []
    wrappers = index.names["save_wrappers"]
    named = [c for key, calls in [*index.calls_by_name.items(), *index.calls_by_method.items()]
             if _HELPER_WRITE.search(key.rsplit(".", 1)[-1]) for c in calls]  # the helpers by name, not every call
    for call in dict.fromkeys(named):
        name = last_name(call.func) or ""  # type: ignore[attr-defined]
        if not _HELPER_WRITE.search(name) or name in wrappers or not call.args and not call.keywords:  # type: ignore[attr-defined]
            continue
        q = index.resolve(call.func) or ""  # type: ignore[attr-defined]
        if q.split(".", 1)[0] in _LIBRARIES or _framework_writer(index, call) is not None:  # type: ignore[arg-type]
            continue
        if index.training_loop_of(call) is None:
            continue
        if _handed_contents(ctx, call) is not None:  # type: ignore[arg-type]
            found.append(call)  # type: ignore[arg-type]
    return found


_HELPER_WRITE = re.compile(r"^_?save_?\w*(checkpoint|ckpt|state|model|classifier|snapshot)|checkpoint$", re.I)
_LIBRARIES = frozenset({"torch", "torchvision", "numpy", "np", "os", "shutil", "pickle", "json", "accelerate",
                        "transformers", "lightning", "pytorch_lightning", "deepspeed", "wandb", "mlflow"})


def _handed_contents(ctx: Context, call: ast.Call) -> tuple[list[ast.AST], list[str]] | None:
    """What a checkpoint helper is handed, read like a saved dict: the contents of a container argument (a dict,
    a record, a name bound to one) and the training objects handed as they are; None unless the optimizer is
    among them (then the helper writes training state), or when `self` goes in whole (it may carry the rest)."""
    index = ctx.index
    values: list[ast.AST] = []
    keys: list[str] = [k.arg for k in call.keywords if k.arg]
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        if isinstance(arg, ast.Name) and arg.id == "self" or isinstance(arg, ast.Starred):
            return None
        found = saved_contents(ctx, arg, call) if isinstance(arg, ast.Name | ast.Dict | ast.Call) else None
        if found is not None and (isinstance(arg, ast.Dict) or found[1]):
            values += found[0]
            keys += found[1]
        elif isinstance(arg, ast.Name | ast.Attribute):
            values.append(arg)
    if "optimizer" not in _kinds_in(index, values) and not any(_OPTIM_WORD.search(k) for k in keys):
        return None
    return values, keys


def _written(ctx: Context, node: ast.Call) -> tuple[ast.AST | None, ast.AST | None, tuple[list[ast.AST], list[str]] | None, str]:
    """(saved object, path, its contents when we can read them, kind): `torch.save(obj, f)` and its wrappers,
    a framework save (`fabric.save(path, state)`), or a checkpoint helper, whose contents are what it is handed."""
    index = ctx.index
    spec = _framework_writer(index, node)
    if spec is not None:
        obj, path = kwarg(node, spec[0], spec[1]), kwarg(node, spec[2], spec[3])
        return obj, path, saved_contents(ctx, obj, node), "framework"
    if index.callee(node) == "torch.save" or (last_name(node.func) or "") in index.names["save_wrappers"]:
        obj, path = kwarg(node, "obj", 0), kwarg(node, "f", 1)
        return obj, path, saved_contents(ctx, obj, node), "torch"
    containers = [a for a in [*node.args, *(k.value for k in node.keywords)] if isinstance(a, ast.Name)
                  and isinstance(latest_value(index, a.id, node), ast.Dict | ast.Call)
                  and _holds_training_state(index, saved_contents(ctx, a, node))]
    obj = containers[0] if len(containers) == 1 else None  # the state the helper is handed, built here
    return obj, None, _handed_contents(ctx, node), "helper"


def _holds_training_state(index: Index, contents: tuple[list[ast.AST], list[str]] | None) -> bool:
    """A container of model or optimizer state (a `.state_dict()`, or the objects themselves), not of metrics."""
    if not contents:
        return False
    values = contents[0]
    return bool(_kinds_in(index, values) & {"module", "optimizer"}) or any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "state_dict"
        for v in values for n in ast.walk(v))


def _checkpoint_without_training_state(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    found = _training_loop_for_save(index, node)
    if found is None:
        return
    loop, anchor, direct = found
    if not _resumes(ctx):
        return  # nothing in the script reads a checkpoint back into training: its saves are exports
    obj, path, contents, kind = _written(ctx, node)
    if path is not None and "best" in ast.unparse(path).lower():
        return
    if _best_model_export(index, node, loop) or (anchor is not node and _best_model_export(index, anchor, loop)):
        return
    if _evaluation_export(index, node, path):
        return
    if _read_only_after_training(ctx, loop, path) or _read_instead_of_training(index, loop, path):
        return
    if contents is None:
        return
    values, keys = list(contents[0]), list(contents[1])
    model = _model_in(index, values)
    if direct and _end_of_run(index, loop, node, model, path):
        return
    optimizer = _optimizer_name(index, model)
    if optimizer is None:
        return
    # What the loop saves altogether: a weights file next to `optimizer.pt`, `scheduler.pt` (the
    # Hugging Face layout) or next to a full checkpoint is complete as a set.
    paths = [path] if path is not None else []
    # Companions: the loop's other saves, and those next to this one in its function (`save_model()` called
    # from the loop writes the weights, `optimizer.pt` and `scheduler.pt` together).
    fn = index.function_of(node)
    companions = list(loop.all_calls()) + [c for c in (index.calls_in(fn) if fn is not None else []) if c not in set(loop.all_calls())]
    all_saves = set(_save_calls(index)) | set(_framework_saves(index))
    accelerators = _accelerators(index)
    for other in companions:
        receiver = dotted(other.func.value) if isinstance(other.func, ast.Attribute) else None
        if other is not node and receiver in accelerators and other.func.attr == "save_state":  # type: ignore[attr-defined]
            # Accelerate writes what it was handed to `prepare()` or `register_for_checkpointing()`, nothing else
            # (DiM's lr_scheduler, never prepared, is missing from every `save_state`)
            values += _prepared(index, receiver)
            continue
        if other is not node and other not in all_saves and _SAVE_HELPER.search(last_name(other.func) or ""):
            # `save_checkpoint(dir, step=step, policy=policy, optimizer=optimizer, scheduler=lr_scheduler)`:
            # a helper of the project writes the training state it is handed next to this file (LeRobot)
            # Only what it is handed directly counts (`optimizer=optimizer`), not names inside its arguments
            # (`save_image(fake, "%s/x.png" % opt.outf)` hands no optimizer, whatever `opt` is).
            handed = [v for v in [*other.args, *(k.value for k in other.keywords)] if isinstance(v, ast.Name | ast.Attribute)]
            handed_kinds = {index.kind_of(v) for v in handed}
            if "optimizer" in handed_kinds or any("optim" in (k.arg or "") for k in other.keywords):
                values += [v for v in handed if index.kind_of(v) in ("optimizer", "scheduler", "scaler")]
                keys += [k.arg for k in other.keywords if k.arg]
            continue
        if other is node or other not in all_saves:
            continue
        found_other = _written(ctx, other)[2]
        if found_other is None:
            counter = last_name(kwarg(other, "obj", 0)) or ""
            if _COUNTER.search(counter):  # `torch.save(train_state.step, 'step.pth')`: the counter, on its own
                keys.append(counter)
                continue
            return  # a companion save we cannot read may hold the rest
        values += found_other[0]
        keys += found_other[1]
        other_path = kwarg(other, "f", 1)
        if other_path is not None:
            paths.append(other_path)
    lowered = [k.lower() for k in keys]
    kinds = _kinds_in(index, values)
    missing: list[str] = []
    parts: list[str] = []  # the short names the checkpointing specialist reads
    additions: list[str] = []
    if "optimizer" not in kinds and not any("optim" in k for k in lowered) and not _stateless(index, optimizer) \
            and not _rebuilt_each_pass(index, optimizer, model, loop) and not _gone_at(index, optimizer, anchor):
        missing.append(f"the optimizer state (`{optimizer}.state_dict()`)")
        parts.append("optimizer")
        additions.append(f'"optimizer": {optimizer}.state_dict()')
    scheduler = _used_binding(index, "scheduler", "step")
    if scheduler and _gone_at(index, scheduler, anchor):
        scheduler = None
    if scheduler and "scheduler" not in kinds and not any("sched" in k for k in lowered) \
            and not _rebuilt_from_epoch(index, scheduler) and (kind != "helper" or _built_here(index, scheduler)):
        missing.append(f"the scheduler state (`{scheduler}.state_dict()`)")
        parts.append("scheduler")
        additions.append(f'"scheduler": {scheduler}.state_dict()')
    scaler = _used_binding(index, "scaler", "scale") or _handed_to_training(index, "scaler")
    if scaler and "scaler" not in kinds and not any("scaler" in k for k in lowered) \
            and (kind != "helper" or _built_here(index, scaler)):
        missing.append(f"the GradScaler state (`{scaler}.state_dict()`)")
        parts.append("scaler")
        additions.append(f'"scaler": {scaler}.state_dict()')
    if direct and kind != "helper":  # a helper may write the counter it keeps itself
        counters = [t for lp in index.loops_around(node) for t in lp.targets if _COUNTER.search(t)]
        referenced = _names_in(values) | _names_in(paths)
        if counters and not any(_COUNTER.search(n) for n in referenced | set(lowered)):
            missing.append(f"the epoch/step counter (`{counters[0]}`)")
            parts.append("epoch")
            additions.append(f'"{counters[0]}": {counters[0]}')
    if not missing:
        return
    group = ctx.memo("checkpointing:groups", set)
    if (id(loop), tuple(parts)) in group:
        return  # the companion saves of one checkpoint (G, D, optimizers) are one finding, at the first
    group.add((id(loop), tuple(parts)))
    suggestion = "{" + ", ".join([f'"model": {model}.state_dict()', *additions]) + "}"
    where = f"the loop over `{loop.source}`" if loop.source else f"the training loop at line {loop.line}"
    if anchor is node and not direct:  # a trainer class's own resume pair (`_trainer_class_checkpoint`)
        info = index.class_of(node)
        reader = _reader_in_class(index, node, info) if info is not None else None
        if info is not None and reader is not None:
            where = f"`{info.name}.{getattr(index.function_of(node), 'name', '?')}`, whose file " \
                    f"`{info.name}.{getattr(index.function_of(reader), 'name', '?')}` reads back (line {reader.lineno}),"
    at: ast.AST = node
    if kind != "torch" and isinstance(obj, ast.Name):
        built = latest_value(index, obj.id, node)
        if isinstance(built, ast.Dict | ast.Call) and index.scope_of(built) is index.scope_of(node):
            at = built  # the dict or record the framework saves: the place to add what it lacks
    variable = snippet(ctx, obj, 40) if obj is not None else "..."
    write = f"torch.save({variable})" if kind == "torch" else f"{ctx.segment(node.func, 30)}({variable})" \
        if kind == "framework" else snippet(ctx, node, 50)
    ctx.report(
        at,
        variable=variable,
        write=write,
        missing=parts,
        missing_text=_join(missing),
        loop=where,
        suggestion=suggestion,
    )


_SAVE_HELPER = re.compile(r"save|checkpoint", re.I)


def _read_only_after_training(ctx: Context, loop: Loop, path: ast.AST | None) -> bool:
    """Every read of a checkpoint comes after training has run, in the training loop's scope: after the loop
    (pyGAT: `torch.save` each epoch, then `model.load_state_dict(torch.load(f"{best_epoch}.pkl"))` to test the
    best epoch), or inside it after its first step (TGN: the best epoch reloaded on early stop, then `break`).
    The process that reads the file still holds the optimizer, so no read is a resume. One of those reads must
    name the saved files (`_same_path`: the same expression, constant or format skeleton): a load of another file
    says nothing."""
    index = ctx.index
    if not any(_same_path(index, path, kwarg(c, "f", 0)) for c in index.calls_to("torch.load")):
        return False
    top = loop
    while top.parent is not None:
        top = top.parent
    end = top.node.end_lineno or top.node.lineno
    scope = index.scope_of(top.node)
    steps = set(index.backward_calls) | set(index.step_calls)
    first = min((_position(c) for c in loop.all_calls()
                 if c in steps or index.local_target(c) in index.training_functions), default=None)
    reads = [*index.calls_to("torch.load"), *index.method_calls("load_state_dict")]
    if not reads or any(index.scope_of(c) is not scope or c.lineno <= end and (
            first is None or _position(c) <= first or c.lineno < top.node.lineno) for c in reads):
        return False
    clocks = _clock_names(index)
    return not any(_RESUME_WORDS.search(dotted(n) or "") and dotted(n) not in clocks
                   for n in ast.walk(ctx.tree) if isinstance(n, ast.Name | ast.Attribute))


def _clock_names(index: Index) -> set[str]:
    """Names only ever assigned a clock reading (`start_epoch = time.time()`, TGN's epoch timer): a timer that
    happens to be named like a resume point."""
    assigned: dict[str, bool] = {}
    for node in index.nodes(ast.Assign):
        for target in node.targets:  # type: ignore[attr-defined]
            name = dotted(target)
            if name is None:
                continue
            value = node.value  # type: ignore[attr-defined]
            clock = isinstance(value, ast.Call) and (index.resolve(value.func) or "").startswith(("time.", "datetime."))
            assigned[name] = assigned.get(name, True) and clock
    return {name for name, clock in assigned.items() if clock}


def _end_of_run(index: Index, loop: Loop, save: ast.Call, model: str, path: ast.AST | None) -> bool:
    """The loop builds the saved model afresh each pass (`tgn = TGN(...)` in `for i in range(args.n_runs):`), and
    the save follows that pass's training: each pass is a whole run, and the file is its finished model. No later
    pass continues from it (the next one starts from a new model), so it is an export, not a checkpoint; unless
    the file is loaded before training starts (a warm start from the last run), in place of training aside."""
    if index.loop_of(save) is not loop:
        return False
    steps = set(index.backward_calls) | set(index.step_calls)
    training = [c for c in loop.all_calls() if c in steps or index.local_target(c) in index.training_functions]
    first = min((_position(c) for c in training), default=None)
    if first is None or _position(save) <= first:
        return False
    for load in index.calls_to("torch.load"):
        if _same_path(index, path, kwarg(load, "f", 0)) and _position(load) < first and not all(
                _exclusive(index, load, run) or _opposite_flags(index, load, run) for run in training):
            return False
    for stmt in loop.node.body:
        if isinstance(stmt, ast.Assign) and _position(stmt) < first and isinstance(stmt.value, ast.Call) \
                and any(dotted(t) == model for t in stmt.targets) \
                and not any(dotted(n) == model for n in ast.walk(stmt.value) if isinstance(n, ast.Name | ast.Attribute)):
            return True
    return False


def _read_instead_of_training(index: Index, loop: Loop, path: ast.AST | None) -> bool:
    """Every load of the saved file runs only where the loop's training does not (GraphMAE: `if not load_model:
    model = pretrain(...)` then `if load_model: model.load_state_dict(torch.load("checkpoint.pt"))`): the file is
    the finished model, read back in place of training, not a point training goes on from."""
    loads = [c for c in index.calls_to("torch.load") if _same_path(index, path, kwarg(c, "f", 0))]
    steps = set(index.backward_calls) | set(index.step_calls)
    training = [c for c in loop.all_calls() if c in steps or index.local_target(c) in index.training_functions]
    return bool(loads) and bool(training) and all(
        _exclusive(index, load, run) or _opposite_flags(index, load, run) for load in loads for run in training)


def _branch_flag(index: Index, node: ast.AST) -> tuple[ast.expr, bool] | None:
    """The test of the innermost `if` around `node` in its function and which way it went to get there:
    `if load_model:` body is (load_model, True), `if not load_model:` body and `if load_model:` else (.., False)."""
    child = node
    for anc in index.ancestors(node):
        if isinstance(anc, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef | ast.Module):
            return None
        if isinstance(anc, ast.If) and child is not anc.test:
            test, taken = anc.test, any(child is stmt for stmt in anc.body)
            while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, taken = test.operand, not taken
            return test, taken
        child = anc
    return None


def _opposite_flags(index: Index, a: ast.AST, b: ast.AST) -> bool:
    """`a` under `if X:` and `b` under `if not X:` (two separate ifs on one flag the code does not rebind between)."""
    fa, fb = _branch_flag(index, a), _branch_flag(index, b)
    if fa is None or fb is None or ast.dump(fa[0]) != ast.dump(fb[0]) or fa[1] == fb[1]:
        return False
    flag = {dotted(n) for n in ast.walk(fa[0]) if isinstance(n, ast.Name | ast.Attribute)}
    lo, hi = sorted((getattr(a, "lineno", 0), getattr(b, "lineno", 0)))
    stores = [n for n in [*index.nodes(ast.Name), *index.nodes(ast.Attribute)] if isinstance(n.ctx, ast.Store)]  # type: ignore[attr-defined]
    return not any(lo < n.lineno < hi and dotted(n) in flag for n in stores)  # type: ignore[attr-defined]


# `restore_memory` (TGN's memory module between evaluations) restores no checkpoint.
_RESUME_WORDS = re.compile(r"resume|restore(?!_?memory)|start_epoch|load_\w*checkpoint|from_checkpoint|continue_from|load_model|load_weights|"
                           r"load_state$", re.I)  # `accelerator.load_state(dir)`
# What the source must hold, lowercased, for one of its names to match `_RESUME_WORDS`: each alternative matches within
# one identifier, and an ASCII file's identifiers are spelled in it as the tree holds them (a non-ASCII one may be
# normalised, and re.I folds some non-ASCII letters: such a file is walked whatever its text holds).
_RESUME_TEXT = ("resume", "restore", "start_epoch", "from_checkpoint", "continue_from", "load_model", "load_weights")


def _may_name_resume(lowered: str) -> bool:
    """Whether an ASCII source, lowercased, can hold a name `_RESUME_WORDS` matches: one of its plain words,
    `load_` and `checkpoint` both (`load_\\w*checkpoint`), or an identifier ending in `load_state` (`load_state$`;
    the `load_state_dict` of every training script does not count)."""
    if any(w in lowered for w in _RESUME_TEXT) or "load_" in lowered and "checkpoint" in lowered:
        return True
    at = lowered.find("load_state")
    while at >= 0:
        end = at + len("load_state")
        if end == len(lowered) or not (lowered[end].isalnum() or lowered[end] == "_"):
            return True
        at = lowered.find("load_state", end)
    return False


def _resumes(ctx: Context) -> bool:
    """Whether the script can read a checkpoint back into training: any `torch.load` or `load_state_dict`, or
    a name that says it (`args.resume`, `start_epoch`, `load_checkpoint(...)`, `load_model(path)`)."""
    def build() -> bool:
        index = ctx.index
        if any(not pretrained_load(index, c) and not _evaluation_only(index, c) for c in index.calls_to("torch.load")) \
                or any(not _in_memory_weights(index, c) and not _pretrained_weights(index, kwarg(c, "state_dict", 0), c)
                       and not _evaluation_only(index, c) for c in index.method_calls("load_state_dict")):
            return True  # weights read back into a model: `--netG PATH` "to continue training", `--epoch N`
        if ctx.source.isascii() and not _may_name_resume(index.lowered()):
            return False  # no name of the file can hold a resume word: the walk of the whole tree is skipped
        return any(_RESUME_WORDS.search(dotted(n) or "") and not _evaluation_only(index, n) for n in subtree(ctx.tree)
                   if isinstance(n, ast.Name | ast.Attribute))
    return ctx.memo("checkpointing:resumes", build)


def _names_pretrained(index: Index, path: ast.AST | None, depth: int = 0) -> bool:
    """A path spelled for weights from another run to start from (vocabulary.toml `pretrained_path_words`):
    `args.pretrain`, `cfg.init_from`, or a local bound to one."""
    if path is None or depth > 2:
        return False
    words = index.names["pretrained_path_words"]
    for n in ast.walk(path):
        text = dotted(n) if isinstance(n, ast.Name | ast.Attribute) else n.value if isinstance(n, ast.Constant) else None
        if isinstance(text, str) and any(w in text.lower() for w in words):
            return True
    if isinstance(path, ast.Name):
        return any(_names_pretrained(index, v, depth + 1) for v in index.definitions(path.id, path))
    return False


def pretrained_load(index: Index, call: ast.Call) -> bool:
    """`torch.load(args.pretrain)`: pretrained weights read to start from, not a resume."""
    return _names_pretrained(index, kwarg(call, "f", 0))


def _pretrained_weights(index: Index, expr: ast.AST | None, at: ast.AST, depth: int = 0) -> bool:
    """The state dict handed to `load_state_dict` comes from a pretrained-weights load: `torch.load(args.pretrain)`,
    a subscript of one, or a local bound to either."""
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Call):
        if "load" in (last_name(expr.func) or ""):
            return _names_pretrained(index, kwarg(expr, "f", 0))
        return False
    if isinstance(expr, ast.Name) and depth < 3:
        values = index.definitions(expr.id, at)
        return bool(values) and _pretrained_weights(index, values[-1], at, depth + 1)
    return False


def _evaluation_function(index: Index, fn: ast.AST | None) -> bool:
    return fn is not None and is_eval_word(getattr(fn, "name", "")) and fn not in index.training_functions


def _evaluation_only(index: Index, node: ast.AST) -> bool:
    """The node runs only for an evaluation: in an evaluation function that does not train (`def evaluate(self,
    test_loader, D_path, G_path): self.load_model(D_path, G_path)`), or in a function that only such functions
    call (pytorch-wgan's `load_model`, called by `evaluate` alone). A checkpoint read there is read to test the
    weights, not to resume training from them."""
    fn = index.function_of(node)
    if fn is None:
        return False
    if _evaluation_function(index, fn):
        return True
    callers = index.callers(fn)
    return bool(callers) and all(_evaluation_function(index, index.function_of(c)) for c in callers)


def _in_memory_weights(index: Index, load: ast.Call) -> bool:
    """`model.load_state_dict(last_model_wts)` with `last_model_wts = model.state_dict()` (layumi's
    Person_reID train.py): weights kept in memory during the run and put back, no file read, so no resume. The
    dict is a `.state_dict()` call, or a local every earlier assignment gives one (through `deepcopy`)."""
    arg = kwarg(load, "state_dict", 0)
    values = [arg] if isinstance(arg, ast.Call) else index.definitions(arg.id, load) if isinstance(arg, ast.Name) else []
    return bool(values) and all(
        any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "state_dict"
            for n in ast.walk(v)) and not any(isinstance(n, ast.Call) and last_name(n.func) == "load"
                                               for n in ast.walk(v))
        for v in values)


def _rebuilt_from_epoch(index: Index, scheduler: str) -> bool:
    """`scheduler.last_epoch = start_epoch - 1` or `LambdaLR(..., last_epoch=...)`: the schedule's position is
    restored from the saved epoch instead of its state_dict."""
    for node in index.nodes(ast.Assign):
        if any(isinstance(t, ast.Attribute) and t.attr == "last_epoch" and dotted(t.value) == scheduler
               for t in node.targets):  # type: ignore[attr-defined]
            return True
    b = index.binding(scheduler)
    last = b.arg("last_epoch") if b is not None else None
    return last is not None and not is_constant(last, -1)


def _model_in(index: Index, values: list[ast.AST]) -> str:
    """The model whose `state_dict()` is saved (`netG.state_dict()` -> netG)."""
    for value in values:
        for node in ast.walk(value):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "state_dict":
                name = dotted(node.func.value)
                if name and (index.is_model(node.func.value) or looks_like_model(name.replace(".module", ""))):
                    return name
    for value in values:  # `D_VAE.state_dict()`: any state_dict that is not an optimizer's, scheduler's or scaler's
        for node in ast.walk(value):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "state_dict":
                name = dotted(node.func.value)
                if name and index.kind_of(node.func.value) not in ("optimizer", "scheduler", "scaler"):
                    return name
    return "model"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# -- torch.load --------------------------------------------------------------------------------


def _same_path(index: Index, a: ast.AST | None, b: ast.AST | None) -> bool:
    if a is None or b is None:
        return False
    forms_a = {ast.dump(a)}
    forms_b = {ast.dump(b)}
    for expr, forms in ((a, forms_a), (b, forms_b)):
        if isinstance(expr, ast.Name):
            value = latest_value(index, expr.id, expr)
            if value is not None:
                forms.add(ast.dump(value))
                expr = value
        template = _path_template(expr)
        if template is not None:
            forms.add(f"template:{template}")
        builder = _path_builder(index, expr)
        if builder is not None:
            forms.add(f"builder:{builder}")
    if forms_a & forms_b:
        return True
    # `self.cache_dir / f"{tag}_dataset"` names `self.cache_dir / "train_dataset"` too: a placeholder stands for any
    # text, when the template has enough literal text around it to name a file.
    templates_a = [f[9:] for f in forms_a if f.startswith("template:")]
    templates_b = [f[9:] for f in forms_b if f.startswith("template:")]
    return any(_fits(ta, tb) or _fits(tb, ta) for ta in templates_a for tb in templates_b)


def _fits(template: str, path: str) -> bool:
    """`path` is one of the files `template` names, its `{}` placeholders standing for any text."""
    if "{}" not in template or len(template.replace("{}", "").strip("/._-")) < 4:
        return False
    pattern = ".+".join(re.escape(part) for part in template.split("{}"))
    return re.fullmatch(pattern, path) is not None


def _path_builder(index: Index, expr: ast.AST) -> str | None:
    """`get_checkpoint_path(epoch)`, a call of the file's own function or lambda: the same files for any epoch."""
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name)):
        return None
    name = expr.func.id
    if name in index.functions or isinstance(latest_value(index, name, expr), ast.Lambda):
        return name
    return None


def _path_template(expr: ast.AST | None) -> str | None:
    """The constant skeleton of a formatted path: `"models/%s/G_%d.pth" % (name, epoch)` and
    `f"{out}/G_{epoch}.pth"` keep their literal parts, so the save of epoch n and the load of epoch m match."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str) and "%" in expr.value:
        return expr.value  # a format string never formatted (a bug of its own) still names the same files
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod) and isinstance(expr.left, ast.Constant) \
            and isinstance(expr.left.value, str):
        return expr.left.value
    if isinstance(expr, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in expr.values]
        text = "".join(str(p) for p in parts)
        return text if text.strip("{}/._-") else None
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "format" \
            and isinstance(expr.func.value, ast.Constant) and isinstance(expr.func.value.value, str):
        return expr.func.value.value
    if isinstance(expr, ast.Call) and (dotted(expr.func) or "").endswith("path.join") and expr.args:
        parts = [_path_template(arg) or (arg.value if isinstance(arg, ast.Constant) else "{}") for arg in expr.args]
        return "/".join(str(p) for p in parts)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):  # pathlib: `self.cache_dir / "train_dataset"`
        parts = []
        for side in (expr.left, expr.right):
            if isinstance(side, ast.Constant) and isinstance(side.value, str):
                parts.append(side.value)
            elif dotted(side) is not None:
                parts.append(f"<{dotted(side)}>")  # the same folder object on both sides, not any folder
            else:
                parts.append(_path_template(side) or "{}")
        return "/".join(parts)
    return None


def _per_rank_path(index: Index, expr: ast.AST | None, depth: int = 0) -> bool:
    """`f"queue{args.rank}.pth"`, or a name bound to one: each process writes and reads its own file, on its
    own device."""
    if expr is None or depth > 2:
        return False
    if isinstance(expr, ast.Name) and any(_per_rank_path(index, v, depth + 1) for v in index.definitions(expr.id, expr)):
        return True
    return any(
        "rank" in (n.id if isinstance(n, ast.Name) else n.attr).lower()
        for n in ast.walk(expr) if isinstance(n, ast.Name | ast.Attribute)
    )


def _saves_host_tensors(index: Index, path: ast.AST | None) -> bool:
    """The file at `path` is written by this script from `.cpu()` tensors, RNG states or dataset objects: it
    loads back onto the CPU."""
    for save in _save_calls(index):
        if _same_path(index, path, kwarg(save, "f", 1)):
            obj = kwarg(save, "obj", 0)
            if _dataset_cache(index, obj, save):
                return True
            values = [obj, *index.definitions(obj.id, save)] if isinstance(obj, ast.Name) else [obj]
            nodes = [n for v in values if v is not None for n in ast.walk(v)]
            moved = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "cpu"
                        for n in nodes)
            # `dict(model=net.state_dict(), steps=self.steps.cpu())`: one counter on the CPU, the weights
            # still where they were trained. Host tensors only when no state_dict goes in as it is.
            as_is = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "state_dict"
                        for n in nodes) and not any(isinstance(n, ast.DictComp | ast.ListComp) for n in nodes)
            if moved and not as_is:
                return True
            if _rng_states_only(values):
                return True
    return False


def _dataset_cache(index: Index, obj: ast.AST | None, at: ast.AST) -> bool:
    """`save_on_master((dataset, traindir), cache_path)` with `dataset = torchvision.datasets.ImageFolder(...)`:
    torchvision's reference scripts cache the dataset object (file lists and transforms), not tensors."""
    items = obj.elts if isinstance(obj, ast.Tuple | ast.List) else [obj]
    datasets = 0
    for item in items:
        if isinstance(item, ast.Name):
            values = [v for v in index.definitions(item.id, at)  # the cache read back in the other branch aside
                      if not (isinstance(v, ast.Call) and index.callee(v) == "torch.load")]
            if values and all(isinstance(v, ast.Call) and ((index.resolve(v.func) or "").startswith("torchvision.datasets.")
                                                           or (last_name(v.func) or "").endswith("Dataset"))
                              for v in values):
                datasets += 1
                continue
        if isinstance(item, ast.Constant | ast.JoinedStr) or isinstance(item, ast.Name) and _PATHISH.search(item.id):
            continue  # the folder the dataset was read from, kept beside it (`(dataset, traindir)`)
        return False
    return datasets > 0


_PATHISH = re.compile(r"(?:dir|path|root|folder|file)s?$", re.IGNORECASE)


_RNG_GETTERS = frozenset({"get_rng_state", "get_rng_state_all", "getstate", "get_state"})


def _rng_states_only(values: list[ast.AST | None]) -> bool:
    """`{"python": random.getstate(), "cpu": torch.random.get_rng_state(), "cuda": torch.cuda.get_rng_state()}`:
    random-number-generator states, which torch hands back as CPU byte tensors even for CUDA generators."""
    entries = [v for d in values if isinstance(d, ast.Dict) for v in d.values]
    return bool(entries) and all(isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute)
                                 and e.func.attr in _RNG_GETTERS for e in entries)


def _written_here(index: Index, path: ast.AST | None) -> bool:
    """The loaded path is one this file writes with torch.save (same expression or same constant)."""
    return any(_same_path(index, _opened(path), _opened(kwarg(save, "f", 1))) for save in index.calls_to("torch.save"))


@rule("TD702", ast.Module)
def unsafe_torch_load(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    savers = [{"class": info.name, "method": name} for info in index.classes.values()
              for name, method in info.methods.items() if _saves_its_parameter(index, method)]
    if savers:
        ctx.leave("torch-save-methods", savers)
    ctx.leave("class-bases", {info.name: [b.rsplit(".", 1)[-1] for b in info.bases] for info in index.classes.values()})
    for call in index.calls_to("torch.load"):
        _unsafe_torch_load(call, ctx)


@project("TD702")
def unsafe_torch_load_in_project(proj: Project) -> list[ProjectHit]:
    """A `load_checkpoint(self, path)` override whose `save_checkpoint` pair lives in a base class of another
    file (nnU-Net's trainer variants): the file it reads is one the trainer family writes itself."""
    savers = {(row["class"], row["method"]) for _f, rows in proj.facts("torch-save-methods") for row in rows}
    bases: dict[str, set[str]] = {}
    for _f, table in proj.facts("class-bases"):
        for name, names in table.items():
            bases.setdefault(name, set()).update(names)
    hits = []
    for f, fact in proj.facts("TD702-method"):
        seen, todo = set(), [fact["class"]]
        while todo and len(seen) < 50:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            todo += sorted(bases.get(cls, ()))
        if not any((cls, fact["save"]) in savers for cls in seen):
            hits.append(ProjectHit(f.path, fact["line"], fact["col"], fact["values"]))
    return hits


def _saves_its_parameter(index: Index, method: ast.AST) -> bool:
    """`def save_checkpoint(self, filename): ... torch.save(checkpoint, filename)`, or a save to a file the method
    names itself from its arguments (diffusion_policy's `save_snapshot(self, tag)`: `torch.save(self,
    path.open('wb'))` with the path built from `tag`)."""
    return any(index.function_of(save) is method for save in index.calls_to("torch.save"))


_LOAD_VERBS = ("load", "restore", "resume", "create_from")


def _opened(expr: ast.AST | None) -> ast.AST | None:
    """The path inside `open(path, "rb")` / `path.open("rb")` (a file object handed to torch.load or torch.save)."""
    if isinstance(expr, ast.Call):
        if isinstance(expr.func, ast.Name) and expr.func.id == "open" and expr.args:
            return expr.args[0]
        if isinstance(expr.func, ast.Attribute) and expr.func.attr == "open":
            return expr.func.value
    return expr


def _paired_save(index: Index, node: ast.Call) -> tuple[str, str] | None:
    """(class, save method) for a load of the path handed to `load_X(self, path)` in a class: the method its
    `save_X` pair (`load_checkpoint` -> `save_checkpoint`) would be, in this class or a base."""
    fn = index.function_of(node)
    path = _opened(kwarg(node, "f", 0))
    info = index.class_of(node)
    if fn is None or info is None or not isinstance(path, ast.Name):
        return None
    if path.id not in {a.arg for a in fn.args.args[1:]}:
        return None
    verb = next((v for v in _LOAD_VERBS if fn.name.startswith(v)), None)
    if verb is None:
        return None
    return info.name, "save" + fn.name[len(verb):]


def _unsafe_torch_load(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    if index.callee(node) != "torch.load" or not ctx.torch_at_least(1, 13):
        return  # weights_only arrived in torch 1.13
    if any(kw.arg is None for kw in node.keywords):
        return  # **kwargs may carry it
    weights_only = kwarg(node, "weights_only")
    pickle_module = kwarg(node, "pickle_module", 2)
    path = kwarg(node, "f", 0)
    if weights_only is None:
        if pickle_module is not None:
            problem = "passes `pickle_module` without `weights_only`, so torch.load falls back to full unpickling (`weights_only=False`), which can run arbitrary code from the file"
        elif not ctx.torch_at_least(2, 6):
            problem = "runs with the pre-2.6 default `weights_only=False`: unpickling the file can run arbitrary code it contains"
        else:
            return  # weights_only=True is the default since 2.6
    if is_constant(weights_only, False) or pickle_module is not None and weights_only is None:
        # A custom pickle module (dill) is full unpickling too: the same files are fine to read that way.
        if _written_here(index, path):
            return  # a file this script wrote itself
        if weights_only is not None:
            problem = "sets `weights_only=False` for a file this script does not write itself: unpickling it runs any code the file carries"
        pair = _paired_save(index, node)
        if pair is not None:  # `load_checkpoint` reading what `save_checkpoint` writes, here or in a base class
            ctx.leave("TD702-method", {"class": pair[0], "save": pair[1], "line": node.lineno,
                                       "col": node.col_offset + 1,
                                       "values": {"variable": _load_call(ctx, node), "problem": problem}})
            return
    elif weights_only is not None:
        return  # True, or a value chosen at run time
    ctx.report(node, variable=_load_call(ctx, node), problem=problem)


def _may_change_device(ctx: Context) -> str | None:
    """Why a script may load a checkpoint on another device than the one that saved it."""
    index = ctx.index
    if index.uses_accelerate():
        return ("every process of this Accelerate script runs it: each first materialises the tensors on the GPU "
                "that saved them (usually cuda:0), piling copies onto one GPU, or fails where that GPU is absent")
    if not names_a_gpu(ctx.source):
        return None
    if index.calls_to("torch.cuda.is_available"):
        return "the script picks its device at run time: a checkpoint saved from a GPU then fails to load on a machine without one"
    if "distributed" in ctx.memo("checkpointing:contexts", index.contexts):
        return "every rank of this distributed script runs it: each rank first materialises the tensors on the GPU that saved them (usually cuda:0), piling copies onto one GPU"
    return None


@rule("TD703", ast.Module)
def load_without_map_location(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    saved = sorted({t for save in index.calls_to("torch.save") for t in _file_templates(index, kwarg(save, "f", 1))})
    if saved:
        ctx.leave("torch-save-files", saved)
    for call in index.calls_to("torch.load"):
        _load_without_map_location(call, ctx)
    for call in index.method_calls("load_from_checkpoint"):  # Lightning's classmethod: torch.load underneath
        _load_without_map_location(call, ctx)


@project("TD703")
def load_without_map_location_in_project(proj: Project) -> list[ProjectHit]:
    """A load this file's own saves do not explain is reported unless another file of the project writes the
    same file: darts' `rnn/train.py` resumes `os.path.join(args.save, 'model.pt')`, which `utils.save_checkpoint`
    writes as `os.path.join(path, 'model.pt')` in the same single-process run."""
    written = {t for _f, templates in proj.facts("torch-save-files") for t in templates}
    return [ProjectHit(f.path, fact["line"], fact["col"], fact["values"])
            for f, fact in proj.facts("TD703") if not written & set(fact["files"])]


def _file_templates(index: Index, path: ast.AST | None) -> set[str]:
    """The path skeletons of a saved or loaded file that name a file of their own (`{}/model.pt`, not `{}/{}`)."""
    if path is None:
        return set()
    exprs = [path]
    if isinstance(path, ast.Name):
        value = latest_value(index, path.id, path)
        if value is not None:
            exprs.append(value)
    out = set()
    for expr in exprs:
        template = expr.value if isinstance(expr, ast.Constant) and isinstance(expr.value, str) else _path_template(expr)
        if template and template.replace("{}", "").strip("/._-%sd"):
            out.add(template)
    return out


def _load_without_map_location(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    lightning = last_name(node.func) == "load_from_checkpoint"
    if index.callee(node) != "torch.load" and not lightning:
        return
    if kwarg(node, "map_location", 1) is not None or any(kw.arg is None for kw in node.keywords):
        return
    path = kwarg(node, "checkpoint_path" if lightning else "f", 0)
    if lightning:
        # Lightning maps CUDA storages to the CPU itself when no GPU is present (saving._default_map_location), so
        # only the multi-process pile-up on the saving GPU, or a file the script maps elsewhere, makes a reason
        if _lightning_ranks(index):
            reason = _SEVERAL_RANKS
        elif _lightning_one_device(index):
            reason = None  # one process on one device: Lightning maps to the CPU where no GPU is, the saving GPU else
        else:
            reason = _mapped_elsewhere(index, node, path)
    else:
        reason = _may_change_device(ctx) or _mapped_elsewhere(index, node, path)
    entry = None
    if reason is None and not lightning:
        # nothing here says where it runs: a library's loader (timm's `ModelEma._load_checkpoint`) runs as often
        # as the script that calls it; the project pass asks whether one of its callers runs as several processes
        entry = _entry_point(index, node)
        if entry is None:
            return
        reason = _SEVERAL_RANKS_CALLER
    if reason is None:
        return
    if reason == _SEVERAL_RANKS and index.rank_guarded(node):
        return  # YOLOP's `if rank in [-1, 0]:` resume: one process reads it, on the GPU rank 0 saved from
    several = index.uses_accelerate() or "distributed" in ctx.memo("checkpointing:contexts", index.contexts)
    if not several and _gpu_branch(index, node):
        return  # under `if torch.cuda.is_available():` the saving GPU is there (the CPU branch is its own load)
    if not several and (_written_here(index, path) or _listed_from_save_dir(index, path)):
        return  # a file this single-process script writes itself: saved and loaded by the same setup
    if _per_rank_path(index, path) or _saves_host_tensors(index, path):
        return  # each rank reads back its own file, saved from its own device; or tensors saved from the CPU
    if any(other is not node and kwarg(other, "map_location", 1) is not None and _exclusive(index, node, other)
           and _same_path(index, path, kwarg(other, "f", 0)) for other in index.calls_to("torch.load")):
        return  # another branch loads the same file with map_location: this one is the branch that needs none
    values = {"variable": _load_call(ctx, node), "reason": reason}
    if entry is not None:
        leave_sites(ctx)
        ctx.leave("TD703-callers", {"class": entry[0], "function": entry[1], "line": node.lineno,
                                    "col": node.col_offset + 1, "values": values})
        return
    files = _file_templates(index, path)
    if not several and files:  # a single-process load another file of the project may write: the project pass decides
        ctx.leave("TD703", {"line": node.lineno, "col": node.col_offset + 1, "values": values, "files": sorted(files)})
        return
    ctx.report(node, **values)


_SEVERAL_RANKS = ("every rank of this distributed script runs it: each rank first materialises the tensors on the GPU "
                  "that saved them (usually cuda:0), piling copies onto one GPU")
_SEVERAL_RANKS_CALLER = ("a distributed script of the project runs it in every rank: each rank first materialises the "
                         "tensors on the GPU that saved them (usually cuda:0), piling copies onto one GPU")


def _entry_point(index: Index, node: ast.AST, depth: int = 0) -> tuple[str | None, str] | None:
    """(class, name) another file calls to run `node`: its function when nothing in this file calls it, else the
    entry of that caller; a method reached from `__init__` runs when the class is built (`ModelEma(...)`)."""
    fn = index.function_of(node)
    if fn is None or depth > 4:
        return None
    callers = index.callers(fn)
    if callers:
        entries = {_entry_point(index, c, depth + 1) for c in callers}
        return entries.pop() if len(entries) == 1 else None
    parent = index.parent(fn)
    owner = parent.name if isinstance(parent, ast.ClassDef) else None
    if owner is not None and fn.name == "__init__":
        return None, owner
    if fn.name.startswith("_") and fn.name != "__call__":
        return None  # a private function nobody calls here is nobody's entry
    return owner, fn.name


@project("TD703")
def load_without_map_location_in_callers(proj: Project) -> list[ProjectHit]:
    """A load in a function or class whose file shows no reason (no GPU choice, no distributed setup), when a
    script of the project that runs as several processes calls it (timm's train.py builds `ModelEma(model,
    resume=args.resume)` in every DDP process; `_load_checkpoint` reads the file with no map_location)."""
    pending = list(proj.facts("TD703-callers"))
    if not pending:
        return []
    context = call_context(proj)
    return [ProjectHit(f.path, fact["line"], fact["col"], fact["values"]) for f, fact in pending
            if context.callers_any(f, fact["function"], "multi_process", fact["class"])]


def _trainer_keywords(index: Index) -> list[dict[str | None, ast.expr]]:
    """The keyword arguments of each Lightning `Trainer(...)` call in the file."""
    return [{kw.arg: kw.value for kw in call.keywords}  # type: ignore[attr-defined]
            for call in index.nodes(ast.Call) if last_name(call.func) == "Trainer"]  # type: ignore[attr-defined]


def _lightning_ranks(index: Index) -> bool:
    """A Lightning script that runs as several processes: a distributed setup call, or a Trainer asked for a
    DDP/FSDP/DeepSpeed strategy, several devices or several nodes."""
    if index.calls_to("torch.distributed.init_process_group", *sorted(index.names["ddp"] | index.names["fsdp"])):
        return True
    for given in _trainer_keywords(index):
        for arg, node in given.items():
            value = node.value if isinstance(node, ast.Constant) else None
            if arg == "strategy" and isinstance(value, str) and any(w in value for w in ("ddp", "fsdp", "deepspeed")):
                return True
            if arg in ("devices", "gpus", "num_nodes") and isinstance(value, int) and not isinstance(value, bool) and value > 1:
                return True
            if arg in ("devices", "gpus") and (value == -1 or isinstance(node, ast.List | ast.Tuple) and len(node.elts) > 1):
                return True
    return False


def _lightning_one_device(index: Index) -> bool:
    """A Lightning Trainer built for one device with no strategy (`Trainer(devices=1)`, `accelerator="cpu"`): a
    single process, so a load without map_location piles nothing onto one GPU (uvadlc tutorial 12's pretrained
    PixelCNN, loaded and then moved with `.to(device)`)."""
    for given in _trainer_keywords(index):
        if "strategy" in given or "num_nodes" in given:
            continue
        one = any(isinstance(given.get(k), ast.Constant) and given[k].value == 1 for k in ("devices", "gpus"))  # type: ignore[union-attr]
        cpu = isinstance(given.get("accelerator"), ast.Constant) and given["accelerator"].value == "cpu"  # type: ignore[union-attr]
        if one or cpu:
            return True
    return False


def _mapped_elsewhere(index: Index, node: ast.Call, path: ast.AST | None) -> str | None:
    """Another torch.load of the same file in this file maps it (nequip's resume: `torch.load(config.ckpt_path,
    map_location="cpu")`, then `load_from_checkpoint(config.ckpt_path, ...)` without): the author knows the file
    holds tensors of another device, and this load puts them back where they were saved."""
    if path is None:
        return None
    for other in index.calls_to("torch.load"):
        if other is node or kwarg(other, "map_location", 1) is None or _exclusive(index, node, other):
            continue
        if _same_path(index, path, kwarg(other, "f", 0)):
            return (f"line {other.lineno} loads the same file with map_location, so it holds tensors saved on another "
                    "device; this load puts them back on the GPU that saved them (on every rank of a multi-GPU run, "
                    "that one GPU)")
    return None


_LISTINGS = ("os.listdir", "glob.glob", "glob.iglob", "os.scandir")


def _join_parts(index: Index, expr: ast.AST | None, depth: int = 0) -> list[str] | None:
    """The arguments of an `os.path.join(...)` path (a name followed to its value), as comparable dumps."""
    if isinstance(expr, ast.Name) and depth < 2:
        value = latest_value(index, expr.id, expr)
        return _join_parts(index, value, depth + 1) if value is not None else None
    if isinstance(expr, ast.Call) and (dotted(expr.func) or "").endswith("path.join") and expr.args \
            and not any(isinstance(a, ast.Starred) for a in expr.args):
        return [ast.dump(a) for a in expr.args]
    return None


def _listed_dirs(index: Index, expr: ast.AST | None, depth: int = 0) -> list[ast.AST]:
    """The folders a path was picked from by listing them: `ckpts = [join(d, f) for f in sorted(os.listdir(d))]`,
    `ckpt_path = ckpts[-1]` -> [d]; `glob.glob(join(d, "*.tar"))` -> [join(d, "*.tar")]."""
    if expr is None or depth > 3:
        return []
    found: list[ast.AST] = []
    for sub in ast.walk(expr):
        if isinstance(sub, ast.Call) and sub.args and (index.resolve(sub.func) or "") in _LISTINGS:
            found.append(sub.args[0])
        elif isinstance(sub, ast.Name):
            for value in index.definitions(sub.id, sub):
                found += _listed_dirs(index, value, depth + 1)
    return found


def _listed_from_save_dir(index: Index, path: ast.AST | None) -> bool:
    """nerf-pytorch: the run resumes the newest file listed in `os.path.join(basedir, expname)`, the folder its
    `torch.save(..., os.path.join(basedir, expname, '{:06d}.tar'.format(i)))` writes into."""
    folders = []
    for listed in _listed_dirs(index, path):
        parts = _join_parts(index, listed)
        if parts is not None:
            folders.append(parts)
    if not folders:
        return False
    for save in index.calls_to("torch.save"):
        saved = _join_parts(index, kwarg(save, "f", 1))
        if saved is not None and len(saved) >= 2 and any(
                f == saved[:-1] or len(f) == len(saved) and f[:-1] == saved[:-1] for f in folders):
            return True  # the listed folder is the save's folder (or a pattern inside it, as glob's)
    return False


def _gpu_branch(index: Index, node: ast.AST) -> bool:
    """`node` only runs where CUDA is available: in the body of `if torch.cuda.is_available() [and ...]:` or the
    `else` of `if not torch.cuda.is_available():`."""
    def cuda_test(test: ast.AST) -> bool:
        parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        return any(isinstance(p, ast.Call) and index.callee(p) == "torch.cuda.is_available" for p in parts)

    child = node
    for anc in index.ancestors(node):
        if isinstance(anc, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return False
        if isinstance(anc, ast.If):
            negated = isinstance(anc.test, ast.UnaryOp) and isinstance(anc.test.op, ast.Not)
            if not negated and child in anc.body and cuda_test(anc.test):
                return True
            if negated and child in anc.orelse and cuda_test(anc.test.operand):  # type: ignore[attr-defined]
                return True
        child = anc
    return False


def _load_call(ctx: Context, node: ast.Call) -> str:
    """`torch.load(args.resume, ...)`: the call, named by what it loads."""
    path = kwarg(node, "f", 0)
    shown = snippet(ctx, path, 40) if path is not None else ""
    more = ", ..." if len(node.args) + len(node.keywords) > 1 else ""
    return f"{snippet(ctx, node.func, 30)}({shown}{more})"


# -- torch.save of a module object ---------------------------------------------------------------


def _module_object(index: Index, expr: ast.AST) -> bool:
    """A module instance (not its state_dict): a module binding, `self` in a Module, `model.module`."""
    if isinstance(expr, ast.Name) and expr.id == "self":
        info = index.class_of(expr)
        return bool(info and info.is_module)
    name = dotted(expr)
    if name is None:
        return False
    if name.endswith((".module", "._orig_mod")):
        return _module_object(index, expr.value)  # type: ignore[attr-defined]
    b = index.binding(expr)
    if b is not None:
        return b.kind == "module"
    if not looks_like_model(name):
        return False
    if isinstance(expr, ast.Name) and latest_value(index, expr.id, expr) is not None:
        return False  # assigned from something the index does not know as a module (a state dict, a load)
    return True  # a parameter named like a model (`def save(model, path)`)


@rule("TD704", ast.Module)
def whole_model_saved(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in index.calls_to("torch.save"):
        _whole_model_saved(call, ctx)


def _whole_model_saved(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    if index.callee(node) != "torch.save":
        return
    obj = kwarg(node, "obj", 0)
    if obj is None:
        return
    candidates: list[ast.AST] = [obj]
    if isinstance(obj, ast.Dict):
        candidates = [v for v in obj.values if v is not None]
    for candidate in candidates:
        if isinstance(candidate, ast.Name | ast.Attribute) and _module_object(index, candidate):
            name = dotted(candidate) or "model"
            ctx.report(node, variable=name)
            return


# -- load_state_dict(strict=False) with the result dropped ------------------------------------------


@rule("TD705", ast.Module)
def strict_false_result_ignored(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in index.method_calls("load_state_dict"):
        _strict_false_result_ignored(call, ctx)


def _strict_false_result_ignored(node: ast.Call, ctx: Context) -> None:
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr != "load_state_dict":
        return
    if not is_constant(kwarg(node, "strict", 1), False):
        return
    index = ctx.index
    if not isinstance(index.parent(node), ast.Expr):
        return  # the result (missing and unexpected keys) is kept
    if index.kind_of(func.value) in ("optimizer", "scheduler", "scaler"):
        return
    if _matched_to_own_keys(index, kwarg(node, "state_dict", 0), node, dotted(func.value)):
        return  # a deliberate partial load: the dict was cut down to (or filled from) the model's own keys
    if _checks_own_keys(index, node, dotted(func.value)):
        return  # the function compares the checkpoint's keys with the model's before loading
    if _own_state_dict_pair(index, node) or _part_of_split_dict(index, node):
        return
    if _trunk_pretrained_elsewhere(index, node):
        return  # the checkpoint holds the parts the pretrained trunk does not: the missing keys are by design
    ctx.report(node, variable=dotted(func.value) or snippet(ctx, func.value, 30), call=snippet(ctx, node, 60))


def _trunk_pretrained_elsewhere(index: Index, node: ast.Call) -> bool:
    """LPIPS: `self.net = vgg16(pretrained=True)` in `__init__`, then `self.load_state_dict(torch.load(ckpt),
    strict=False)` (or `model = cls(); model.load_state_dict(...)`) loads only the linear heads the checkpoint
    has; the trunk's weights come from its own pretrained source (Stability-AI generative-models, taming)."""
    target = node.func.value  # type: ignore[attr-defined]
    info = index.class_of(node)
    if info is None or not info.is_module:
        return False
    if not (isinstance(target, ast.Name) and (target.id == "self" or any(
            isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("cls", info.name)
            for v in index.definitions(target.id, node)))):
        return False
    init = info.method("__init__")
    if init is None:
        return False
    for call in ast.walk(init):
        if not isinstance(call, ast.Call):
            continue
        if isinstance(call.func, ast.Attribute) and call.func.attr == "from_pretrained":
            return True
        for kw in call.keywords:
            if kw.arg == "pretrained" and is_constant(kw.value, True) or \
                    kw.arg == "weights" and not (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                return True
    return False


def _own_state_dict_pair(index: Index, node: ast.Call) -> bool:
    """The load sits in `load_state_dict` of a class that also writes the dict in its own `state_dict`
    (torchtitan's ModelWrapper flattens several model parts into one dict; LeRobot's SAC strips the encoder
    keys): the class defines its own key layout, so the partial load of each part is by design."""
    fn = index.function_of(node)
    if fn is None or getattr(fn, "name", "") != "load_state_dict":
        return False
    owner = index.parent(fn)
    return isinstance(owner, ast.ClassDef) and any(
        isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name == "state_dict" for m in owner.body)


def _part_of_split_dict(index: Index, node: ast.Call) -> bool:
    """nerfstudio's `Pipeline.load_state_dict(self, state_dict, ...)`: the `_model.` keys go to `self.model`, and
    `super().load_state_dict(rest, strict=False)` gets `rest = {k: v for k, v in state_dict.items() if not ...}`:
    the override splits its own argument, so the other part's keys are missing by design."""
    fn = index.function_of(node)
    if fn is None or getattr(fn, "name", "") != "load_state_dict" or len(fn.args.args) < 2:  # type: ignore[attr-defined]
        return False
    param = fn.args.args[1].arg  # type: ignore[attr-defined]
    loaded = kwarg(node, "state_dict", 0)
    values = index.definitions(loaded.id, node) if isinstance(loaded, ast.Name) else []
    for value in values:
        if isinstance(value, ast.DictComp) and any(
                gen.ifs and isinstance(gen.iter, ast.Call) and isinstance(gen.iter.func, ast.Attribute)
                and gen.iter.func.attr == "items" and dotted(gen.iter.func.value) == param
                for gen in value.generators):
            return True
    return False


_OWN_KEYS = frozenset({"state_dict", "named_parameters", "named_buffers", "parameters"})


def _checks_own_keys(index: Index, node: ast.Call, model: str | None) -> bool:
    """Earlier in the load's function, the model's own keys are read (`model_dict = net.state_dict()`,
    `for n, p in self.transformer.named_parameters():`) and keys are tested for membership (`if key not in
    model_dict: continue`, `if n not in state_dict: state_dict[n] = p`): what strict=False lets through was
    decided here, key by key."""
    fn = index.function_of(node)
    if fn is None or model is None:
        return False
    root = model.split(".")[0] if not model.startswith("self.") else ".".join(model.split(".")[:2])
    reads = membership = False
    for sub in ast.walk(fn):
        if getattr(sub, "lineno", node.lineno) >= node.lineno:
            continue
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _OWN_KEYS:
            owner = dotted(sub.func.value) or ""
            reads = reads or owner == model or owner == root or owner.startswith(root + ".")
        elif isinstance(sub, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in sub.ops):
            membership = True
    return reads and membership


def _matched_to_own_keys(index: Index, loaded: ast.AST | None, at: ast.AST, model: str | None, depth: int = 0) -> bool:
    """`csd = intersect_dicts(ckpt, model.state_dict())`, `{k: v for k, v in sd.items() if k in model_dict}`,
    or `sd[k] = model.state_dict()[k]` for the missing ones: the dict is built against the model's own keys."""
    if loaded is None or depth > 2:
        return False
    exprs: list[ast.AST] = [loaded]
    if isinstance(loaded, ast.Name):
        exprs += index.definitions(loaded.id, at)
        fn = index.function_of(at)
        scope = fn if fn is not None else index.tree
        filled = [n for n in ast.walk(scope) if isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Subscript) and dotted(t.value) == loaded.id for t in n.targets)]
        exprs += filled
        for stmt in filled:  # `if new_k in model_dict and v.shape == ...: filtered[new_k] = v`
            for anc in index.ancestors(stmt):
                if anc is scope:
                    break
                if isinstance(anc, ast.If):
                    exprs.append(anc.test)
    roots = _model_roots(index, model, at)
    for expr in exprs:
        for sub in ast.walk(expr):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "state_dict":
                owner = dotted(sub.func.value) or ""
                if model is None or owner == model or owner.split(".")[0] == model.split(".")[0] \
                        or _root(sub.func.value) in roots:
                    return True
            if isinstance(sub, ast.Name) and sub.id != getattr(loaded, "id", None) and depth < 2 \
                    and isinstance(index.parent(sub), ast.Compare | ast.Call | ast.keyword):
                # `if k in model_dict` where model_dict = model.state_dict(), or the dict adapted by a helper
                # handed the model's own state (nnU-Net: `adapt_encoder_weights(..., target_state_dict=target)`)
                if _matched_to_own_keys(index, sub, at, model, depth + 1):
                    return True
    return False


def _root(expr: ast.AST) -> str | None:
    """The name a chain starts from: `network` in `network.get_submodule(key).state_dict`."""
    while isinstance(expr, ast.Attribute | ast.Call | ast.Subscript):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _model_roots(index: Index, model: str | None, at: ast.AST) -> set[str]:
    """The names the loaded module comes from: `encoder_module = network.get_submodule(key)` -> {encoder_module,
    network}, so a dict built against `network.get_submodule(key).state_dict()` counts as its own keys."""
    if not model:
        return set()
    head = model.split(".")[0]
    roots = {head}
    for value in index.definitions(head, at):
        root = _root(value)
        if root is not None:
            roots.add(root)
    return roots


# -- TD706: a checkpoint saved unwrapped, loaded into the wrapper ------------------------------

_SAVE_NAME = re.compile(r"save|checkpoint|snapshot", re.IGNORECASE)
# A helper that reads this run's own checkpoint back (`load_checkpoint`, `resume_model`), not pretrained weights
_LOAD_HELPER = re.compile(r"^(load|resume|restore)\w*(checkpoint|ckpt|resume|snapshot|restore)|^(resume|restore)", re.I)


def _unwrapped_roots(index: Index, sites: dict[str, list[ast.AST | None]]) -> dict[str, str]:
    """Models this file saves unwrapped: `model.module.state_dict()`, or the state_dict of a name bound to
    `model.module if hasattr(model, "module") else model` (or `getattr(model, "module", model)`), in a function
    that saves. The root (`model`, `self.model`) may be a DataParallel/DDP wrapper there; with the code shown.
    `sites` gets the functions where each root is unwrapped."""
    roots: dict[str, str] = {}
    aliases: dict[str, tuple[str, ast.AST]] = {}  # alias -> (root, its value)
    for stmt in index.nodes(ast.Assign):
        value = stmt.value  # type: ignore[attr-defined]
        root = _unwrap_of(value)
        if root is not None:
            for target in stmt.targets:  # type: ignore[attr-defined]
                name = dotted(target)
                if name is not None:
                    aliases[name] = (root, value)
    for call in index.method_calls("state_dict"):
        receiver = call.func.value  # type: ignore[attr-defined]
        name = dotted(receiver)
        if name is None:
            continue
        if name.endswith(".module") and isinstance(receiver, ast.Attribute):
            root, shown = dotted(receiver.value), name
        elif name in aliases:
            root, shown = aliases[name][0], name
        elif _prefix_stripped(index, call):
            root, shown = name, f"{{k without 'module.': v for k, v in {name}.state_dict().items()}}"
        else:
            continue
        fn = index.function_of(call)
        if root is not None and _saves_in(index, fn):
            roots.setdefault(root, shown if shown.startswith("{") else f"{shown}.state_dict()")
            sites.setdefault(root, []).append(fn)
    return roots


def _prefix_stripped(index: Index, call: ast.Call) -> bool:
    """`model.state_dict()` whose items are copied with `module.` cut from every key, then saved: the same keys
    as `model.module.state_dict()` (ST-TR's `OrderedDict([[k.split('module.')[-1], v.cpu()] for k, v in
    state_dict.items()])`), directly or through the name the state dict is bound to."""
    if "module." not in index.source and "7:" not in index.source:
        return False  # no key edit to look for (the text test spares the walk)
    names = {id(call)}
    stmt = index.statement_of(call)
    bound = dotted(stmt.targets[0]) if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
        and stmt.value is call else None
    fn = index.function_of(call)
    for comp in subtree(fn if fn is not None else index.tree):
        if not isinstance(comp, ast.ListComp | ast.DictComp | ast.GeneratorExp) or len(comp.generators) != 1:
            continue
        items = comp.generators[0].iter
        if not (isinstance(items, ast.Call) and isinstance(items.func, ast.Attribute) and items.func.attr == "items"):
            continue
        source = items.func.value
        if not (id(source) in names or bound is not None and dotted(source) == bound):
            continue
        key = comp.key if isinstance(comp, ast.DictComp) else comp.elt
        if any(isinstance(n, ast.Constant) and n.value == "module." for n in ast.walk(key)) or any(
                isinstance(n, ast.Slice) and is_constant(n.lower, 7) and n.upper is None for n in ast.walk(key)):
            return True
    return False


def _unwrap_of(value: ast.AST) -> str | None:
    """`m.module if <test> else m` and `getattr(m, "module", m)`: the root `m`."""
    if isinstance(value, ast.IfExp):
        body, other = dotted(value.body), dotted(value.orelse)
        if body is not None and other is not None and body == f"{other}.module":
            return other
        if body is not None and other is not None and other == f"{body}.module":
            return body
    if isinstance(value, ast.Call) and last_name(value.func) == "getattr" and len(value.args) == 3:
        obj, attr, default = value.args
        if is_constant(attr, "module") and dotted(obj) is not None and dotted(obj) == dotted(default):
            return dotted(obj)
    return None


def _saves_in(index: Index, fn: ast.AST | None) -> bool:
    """Whether this function (or the module level) writes a checkpoint: torch.save or a save helper's call."""
    for call in index.calls_in(fn):
        if index.callee(call) == "torch.save" or _SAVE_NAME.search(last_name(call.func) or ""):
            return True
    return False


def _loaded_into(index: Index, call: ast.Call, roots: dict[str, str]) -> str | None:
    """The unwrapped-saved root that `call` loads a checkpoint into as it is: `model.load_state_dict(ckpt[...])`
    with a loaded dict, or a load helper handed the model (`load_checkpoint(resume, self.model, optimizer)`)."""
    name = last_name(call.func)
    if name == "load_state_dict" and isinstance(call.func, ast.Attribute):
        root = dotted(call.func.value)
        if root in roots and call.args and _from_a_file(index, call.args[0], call) \
                and not _pretrained_weights(index, call.args[0], call):
            return root
        return None
    if name and _LOAD_HELPER.match(name) and index.local_target(call) is None:
        if any(_names_pretrained(index, a) for a in [*call.args, *(k.value for k in call.keywords)]):
            return None  # `load_checkpoint(args.pretrained, model)`: another run's weights to start from
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            if dotted(arg) in roots:
                return dotted(arg)
    return None


def _from_a_file(index: Index, expr: ast.AST, at: ast.AST, depth: int = 0) -> bool:
    """A state dict read from a file: `torch.load(...)`, a subscript of one, or a name bound to either."""
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Call):
        return "load" in (last_name(expr.func) or "")
    if isinstance(expr, ast.Name) and depth < 3:
        values = index.definitions(expr.id, at)
        return bool(values) and _from_a_file(index, values[-1], at, depth + 1)
    return False


def _same_object(index: Index, call: ast.Call, root: str, unwrapped_in: list[ast.AST | None]) -> bool:
    """The load's `root` is the object the save unwrapped: a local name in the same function, or `self.x` in
    the same class (a `net` of one method is not the `net` of another)."""
    fn = index.function_of(call)
    if not root.startswith("self."):
        return fn in unwrapped_in or any(_helper_pair(index, saver, fn, root) for saver in unwrapped_in)
    here = _class_around(index, call)
    return here is not None and any(f is not None and _class_around(index, f) is here for f in unwrapped_in)


def _helper_pair(index: Index, saver: ast.AST | None, loader: ast.AST | None, root: str) -> bool:
    """A save helper and a load helper of one module (or one class) that both take the model as the same
    parameter (acoustic-model's `save_checkpoint(checkpoint_dir, acoustic, ...)` / `load_checkpoint(load_path,
    acoustic, ...)`): the module's checkpoint pair, to which the training script hands the same model."""
    if saver is None or loader is None or saver is loader:
        return False
    if not all(isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) for f in (saver, loader)):
        return False
    if index.parent(saver) is not index.parent(loader) or not _LOAD_HELPER.match(loader.name) \
            or not _SAVE_NAME.search(saver.name):  # type: ignore[union-attr]
        return False
    if not all(root in {a.arg for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs}  # type: ignore[union-attr]
               for f in (saver, loader)):
        return False
    # the saver unwraps unconditionally, so its callers always hand it the wrapper; one that unwraps only
    # `if distributed` (CvT's save_checkpoint_on_master) is handed either, and says nothing of the load's model
    unwraps = [c for c in index.calls_in(saver) if isinstance(c.func, ast.Attribute) and c.func.attr == "state_dict"
               and dotted(c.func.value) == f"{root}.module"]
    return bool(unwraps) and not any(isinstance(a, ast.IfExp | ast.If) for c in unwraps
                                     for a in _ancestors_until(index, c, saver))


def _ancestors_until(index: Index, node: ast.AST, stop: ast.AST) -> list[ast.AST]:
    out = []
    for anc in index.ancestors(node):
        if anc is stop:
            break
        out.append(anc)
    return out


def _class_around(index: Index, node: ast.AST) -> ast.ClassDef | None:
    return next((a for a in index.ancestors(node) if isinstance(a, ast.ClassDef)), None)


def _wraps(index: Index, stmt: ast.AST, root: str) -> bool:
    """`model = DDP(model, ...)`, `self.model = nn.DataParallel(self.model)`, `model = make_data_parallel(model, ...)`."""
    if not isinstance(stmt, ast.Assign) or not isinstance(stmt.value, ast.Call):
        return False
    if not any(dotted(t) == root for t in stmt.targets):
        return False
    value = stmt.value
    while isinstance(value.func, ast.Attribute) and value.func.attr in ("cuda", "to") and isinstance(
            value.func.value, ast.Call):
        value = value.func.value  # `DataParallelModel(self.model).cuda()`
    wrappers = index.names["ddp"] | index.names["fsdp"]
    if any(c in wrappers or c.endswith("DataParallel") for c in index.class_choices(value.func)):
        return True
    name = (last_name(value.func) or "").lower()
    return any(w in name for w in ("parallel", "ddp", "distributed", "wrap")) and any(
        dotted(a) == root for a in value.args)


def _wrapped_after(index: Index, call: ast.AST, root: str, depth: int = 0) -> bool:
    """The model is wrapped after this load, in the load's function or in a caller after its call: it was bare
    when it was loaded (pytorch/examples' Trainer: `self._load_snapshot(path)`, then `self.model = DDP(...)`)."""
    fn = index.function_of(call)
    scope = fn if fn is not None else index.tree
    if any(getattr(stmt, "lineno", 0) > call.lineno and _wraps(index, stmt, root)  # type: ignore[attr-defined]
           for stmt in ast.walk(scope)):
        return True
    return fn is not None and depth < 2 and any(_wrapped_after(index, c, root, depth + 1) for c in index.callers(fn))


def _handles_prefix(index: Index, call: ast.Call, root: str) -> bool:
    """The load already copes with the wrapper: it sits under `isinstance(model, DDP)`/`hasattr(model, "module")`,
    its function edits `module.` prefixes, or wraps the model only after loading."""
    for anc in index.ancestors(call):
        if isinstance(anc, ast.If) and any(
            isinstance(n, ast.Call) and last_name(n.func) in ("isinstance", "hasattr") and n.args and dotted(n.args[0]) == root
            for n in ast.walk(anc.test)
        ):
            return True
    fn = index.function_of(call)
    scope = fn if fn is not None else index.tree
    for sub in ast.walk(scope):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and "module." in sub.value and len(sub.value) < 12:
            return True  # `k.replace("module.", "")`, `k.startswith("module.")`
        if isinstance(sub, ast.Slice) and is_constant(sub.lower, 7) and sub.upper is None:
            return True  # `key[7:]`: drops `module.`
    return _wrapped_after(index, call, root)  # `model.load_state_dict(...)` then `model = DDP(model)`


@rule("TD706", ast.Module)
def unwrapped_checkpoint_loaded_into_wrapper(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    sites: dict[str, list[ast.AST | None]] = {}
    roots = _unwrapped_roots(index, sites)
    if not roots:
        return
    for call in index.nodes(ast.Call):
        root = _loaded_into(index, call, roots)  # type: ignore[arg-type]
        if root is None or not _same_object(index, call, root, sites[root]) or _handles_prefix(index, call, root):  # type: ignore[arg-type]
            continue
        if _key_saved_wrapped(index, call, root) or _bare_in_this_branch(index, call, root):  # type: ignore[arg-type]
            continue
        ctx.report(call, variable=root, unwrapped=roots[root], prefix="-module.")


def _key_saved_wrapped(index: Index, call: ast.Call, root: str) -> bool:
    """The load reads `ckpt["state_dict"]` and the file saves that key from the wrapper itself
    (`{"state_dict": model.state_dict(), "best_state_dict": model.module.state_dict()}` in HRNet's tools/train.py):
    the unwrapped copy is another key, for export, and the resume reads the wrapped one back."""
    if not call.args or not isinstance(call.args[0], ast.Subscript):
        return False
    key = call.args[0].slice
    if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
        return False
    wrapped = unwrapped = False
    for d in ast.walk(index.tree):  # only for a load already flagged: a rare walk
        if not isinstance(d, ast.Dict):
            continue
        for k, v in zip(d.keys, d.values, strict=True):
            if not (is_constant(k, key.value) and isinstance(v, ast.Call) and last_name(v.func) == "state_dict"
                    and isinstance(v.func, ast.Attribute)):
                continue
            receiver = dotted(v.func.value)
            wrapped |= receiver == root
            unwrapped |= receiver == f"{root}.module"
    return wrapped and not unwrapped


def _bare_in_this_branch(index: Index, call: ast.Call, root: str) -> bool:
    """The load sits in the `else` of `if T:` and the model is wrapped only under `if T:` (PyTorch-Encoding's
    segmentation trainer: `if args.cuda: self.model = DataParallelModel(self.model)`, then `if args.cuda:
    self.model.module.load_state_dict(...) else: self.model.load_state_dict(...)`): there it is bare."""
    tests = []
    child: ast.AST = call
    for anc in index.ancestors(call):
        if isinstance(anc, ast.If) and child in anc.orelse:
            tests.append(ast.dump(anc.test))
        child = anc
    if not tests:
        return False
    wraps = [stmt for stmt in index.nodes(ast.Assign) if _wraps(index, stmt, root)]
    if not wraps:
        return False
    for stmt in wraps:
        child = stmt
        guarded = False
        for anc in index.ancestors(stmt):
            if isinstance(anc, ast.If) and child in anc.body and ast.dump(anc.test) in tests:
                guarded = True
                break
            child = anc
        if not guarded:
            return False
    return True


# -- TD707: a resume that restores the weights and the epoch but not the optimizer --------------------


def _writes_optimizer(ctx: Context) -> str | None:
    """The optimizer this file writes into its checkpoints: inside what a torch.save writes
    (`{"optimizer": optimizer.state_dict()}`), or handed to a save helper (`save_checkpoint(epoch, arch, model,
    optimizer, ...)`)."""
    index = ctx.index
    if ctx.source.isascii() and "save" not in index.lowered():
        return None  # no name of the file holds "save" (torch.save included): no call below is read
    for call in index.nodes(ast.Call):
        name = last_name(call.func) or ""  # type: ignore[attr-defined]
        if index.callee(call) == "torch.save":  # type: ignore[arg-type]
            objects = [kwarg(call, "obj", 0)]  # type: ignore[arg-type]
        elif "save" in name.lower() and "load" not in name.lower() and index.local_target(call) is None:  # type: ignore[arg-type]
            objects = [*call.args, *(k.value for k in call.keywords)]  # type: ignore[attr-defined]
        else:
            continue
        for obj in objects:
            found = saved_contents(ctx, obj, call) if obj is not None else None
            values = found[0] if found else [obj] if obj is not None else []
            for value in values:
                for sub in ast.walk(value):
                    if isinstance(sub, ast.Name | ast.Attribute) and index.kind_of(sub) == "optimizer":
                        return dotted(sub)
    return None


def _reads_optimizer_back(index: Index) -> bool:
    """Whether anything in the file restores optimizer state: `optimizer.load_state_dict(...)`, a load helper
    handed the optimizer, `ckpt["optimizer"]` read back, or a framework that restores everything
    (`accelerator.load_state`, Fabric's `load`)."""
    for call in index.method_calls("load_state_dict"):
        receiver = call.func.value  # type: ignore[attr-defined]
        if index.kind_of(receiver) == "optimizer" or "optim" in (dotted(receiver) or "").lower():
            return True
    # a call below is named for loading, resuming or restoring: a file whose text has none of the three words (an
    # ASCII text: the parser normalises identifiers) skips the loop over every call
    lowered = index.lowered()
    calls = index.nodes(ast.Call) if not index.source.isascii() or any(
        w in lowered for w in ("load", "resume", "restore")) else ()
    for call in calls:
        name = (last_name(call.func) or "").lower()  # type: ignore[attr-defined]
        if name == "load_state" or (("load" in name or "resume" in name or "restore" in name) and any(
            index.kind_of(a) == "optimizer" or "optim" in (dotted(a) or "").lower()
            for arg in [*call.args, *(k.value for k in call.keywords)]  # type: ignore[attr-defined]
            for a in _alternatives(arg) if isinstance(a, ast.Name | ast.Attribute)
        )):
            return True
    for sub in subtree(index.tree):
        if isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Load) and isinstance(sub.slice, ast.Constant):
            key = sub.slice.value
            if isinstance(key, str) and "optim" in key.lower():
                return True
    return False


def _alternatives(expr: ast.expr) -> list[ast.expr]:
    """The values an argument may take: both branches of `None if args.no_resume_opt else optimizer` (timm's
    `resume_checkpoint(model, path, optimizer=...)` in poolformer's train.py: the optimizer is restored unless
    the user opts out)."""
    if isinstance(expr, ast.IfExp):
        return [*_alternatives(expr.body), *_alternatives(expr.orelse)]
    return [expr]


_EPOCH_WORD = re.compile(r"epoch|iteration|iters?\b|step", re.IGNORECASE)


def _resume_loads(ctx: Context) -> list[tuple[ast.Call, str]]:
    """Loads that resume training: the weights go back into a model and the epoch (or step) is read from the
    same checkpoint. A load helper handed the model whose result gives the epoch (`model, sched, start_epoch =
    load_checkpoint(model, chkpt_file=args.resume)`), or `model.load_state_dict(ckpt[...])` where the same
    function reads `ckpt["epoch"]`. With the model's name."""
    index = ctx.index
    found: list[tuple[ast.Call, str]] = []
    for stmt in index.nodes(ast.Assign):
        value = stmt.value  # type: ignore[attr-defined]
        if not isinstance(value, ast.Call) or index.local_target(value) is not None:
            continue
        name = (last_name(value.func) or "").lower()
        if not (name.startswith(("load", "resume", "restore")) and ("checkpoint" in name or "ckpt" in name or "resume" in name)):
            continue
        targets = [n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)]  # type: ignore[attr-defined]
        epochs = [t for t in targets if _EPOCH_WORD.search(t)]
        if not epochs or not any(_name_used(index, t, stmt) for t in epochs):
            continue
        model = next((dotted(a) for a in [*value.args, *(k.value for k in value.keywords)]
                      if isinstance(a, ast.Name | ast.Attribute) and (index.kind_of(a) == "module" or looks_like_model(dotted(a) or ""))), None)
        if model is not None:
            found.append((value, model))
    for call in index.method_calls("load_state_dict"):
        receiver = call.func.value  # type: ignore[attr-defined]
        if index.kind_of(receiver) == "optimizer" or not call.args:
            continue
        source = call.args[0]
        while isinstance(source, ast.Subscript):
            source = source.value
        if not isinstance(source, ast.Name) or not _is_loaded_file(index, source, call):
            continue
        fn = index.function_of(call)
        reads_epoch = any(
            isinstance(sub, ast.Subscript) and dotted(sub.value) == source.id and isinstance(sub.slice, ast.Constant)
            and isinstance(sub.slice.value, str) and _EPOCH_WORD.search(sub.slice.value) and _value_used(index, sub)
            for sub in ast.walk(fn if fn is not None else index.tree)
        )
        if reads_epoch and (index.kind_of(receiver) == "module" or looks_like_model(dotted(receiver) or "")):
            found.append((call, dotted(receiver) or "the model"))
    return found


def _shown_only(index: Index, node: ast.AST) -> bool:
    """The value goes only to output: an argument of `print`/`logger.info`/`pbar.set_description` (vocabulary.toml
    `output_calls`) or part of an f-string."""
    outputs = index.names["output_calls"]
    for anc in index.ancestors(node):
        if isinstance(anc, ast.stmt):
            return False
        if isinstance(anc, ast.JoinedStr) or isinstance(anc, ast.Call) and last_name(anc.func) in outputs:
            return True
    return False


def _name_used(index: Index, name: str, stmt: ast.AST) -> bool:
    """A local bound at `stmt` is read after it for something other than output (a loop's start, a counter)."""
    fn = index.function_of(stmt)
    scope = fn if fn is not None else index.tree
    reads = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
             and n.lineno >= stmt.lineno]  # type: ignore[attr-defined]
    return any(not _shown_only(index, n) for n in reads)


def _value_used(index: Index, read: ast.AST) -> bool:
    """The epoch read from a checkpoint does something: it is not only printed, and a local it is stored in is read
    for more than output (`start_epoch = ckpt["epoch"]` then `range(start_epoch, ...)`); stored in an attribute
    (`args.start_epoch = ...`) it is taken as used."""
    if _shown_only(index, read):
        return False
    stmt = index.statement_of(read)
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
        return any(_name_used(index, t.id, stmt) for t in stmt.targets)  # type: ignore[attr-defined]
    return True


def _is_loaded_file(index: Index, name: ast.Name, at: ast.AST) -> bool:
    values = index.definitions(name.id, at)
    return bool(values) and isinstance(values[-1], ast.Call) and index.callee(values[-1]) == "torch.load"


@rule("TD707", ast.Module)
def resume_without_optimizer_state(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    optimizer = _writes_optimizer(ctx)
    if optimizer is None or _stateless(index, optimizer) or _reads_optimizer_back(index):
        return
    for call, model in _resume_loads(ctx):
        ctx.report(call, variable=model, optimizer=optimizer)

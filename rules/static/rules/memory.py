"""TD1xx — tensor operations and memory: graphs kept alive across steps, validation with autograd on,
the caching allocator emptied every step. Docs: memory.toml."""

from __future__ import annotations

import ast

from torchdoctor.rules.static.api import Context, project, rule
from torchdoctor.rules.static.callcontext import defer, leave_sites, settle
from torchdoctor.rules.static.index import WITHS, Index, dotted, is_constant, kwarg, looks_like_loader
from torchdoctor.rules.static.patterns import backward_names, holds_graph, latest_value
from torchdoctor.rules.static.project import Project, ProjectFile, ProjectHit
from torchdoctor.rules.static.semantic import practice
from torchdoctor.rules.static.semantic.callsites import outermost_uncalled
from torchdoctor.rules.static.semantic.flow import one_constructor
from torchdoctor.rules.static.semantic.subtree import subtree


def _accumulation(node: ast.AST) -> tuple[ast.AST, list[ast.expr]] | None:
    """(accumulator, values added) for `acc += v`, `acc = acc + v`, `acc.append(v)`, `acc.extend([v])`."""
    if isinstance(node, ast.AugAssign):
        if isinstance(node.op, ast.Add):
            return node.target, [node.value]
        return None
    if isinstance(node, ast.Assign):
        if len(node.targets) != 1 or not isinstance(node.value, ast.BinOp) or not isinstance(node.value.op, ast.Add):
            return None
        target = dotted(node.targets[0])
        left, right = node.value.left, node.value.right
        if target is not None and dotted(left) == target:
            return node.targets[0], [right]
        if target is not None and dotted(right) == target:
            return node.targets[0], [left]
        return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        if node.func.attr == "append" and len(node.args) == 1:
            return node.func.value, [node.args[0]]
        if node.func.attr == "extend" and isinstance(node.args[0], ast.List | ast.Tuple):
            return node.func.value, list(node.args[0].elts)
    return None


def _accumulator_name(target: ast.AST) -> str | None:
    while isinstance(target, ast.Subscript):  # history["loss"].append(loss)
        target = target.value
    return dotted(target)


@rule("TD101", ast.Module, ast.Call, reads=(ast.AugAssign, ast.Assign), methods=("append", "extend"))
def graph_accumulated_across_steps(node: ast.AST, ctx: Context) -> None:
    if isinstance(node, ast.Module):
        _leave_graph_returns(ctx)  # once per file, for the project pass
        _leave_kept_arguments(ctx)
        _accumulated_in_methods(ctx)
        _outputs_kept_for_epoch_end(ctx)
        # The `+=` statements, then the `acc = acc + v` assignments, in the walk's order (the `.append` calls come
        # next, from the engine): one loop over the file's assignments, not a check called on each of them.
        for stmt in ctx.index.nodes(ast.AugAssign):
            _accumulated_across_steps(stmt, ctx)
        binop, add = ast.BinOp, ast.Add
        for stmt in ctx.index.nodes(ast.Assign):
            value = stmt.value  # type: ignore[attr-defined]
            if value.__class__ is binop and isinstance(value.op, add) and len(stmt.targets) == 1:  # type: ignore[attr-defined]
                _accumulated_across_steps(stmt, ctx)
        return
    _accumulated_across_steps(node, ctx)


def _accumulated_across_steps(node: ast.AST, ctx: Context) -> None:
    found = _accumulation(node)
    if found is None:
        return
    index = ctx.index
    loop = index.training_loop_of(node)
    if loop is None:
        # A loop over batches whose training happens in another file (`losses = train_util.train_step(...)`):
        # the project pass can still tell whether what it adds up holds the graph.
        name = _accumulator_name(found[0]) or ""
        if "loss" in name.lower() and index.loop_of(node) is not None and not index.grad_disabled(node):
            _leave_external_accumulation(ctx, node, found)  # the callee running a backward says it trains
        return
    if index.grad_disabled(node):
        return
    target, values = found
    name = _accumulator_name(target)
    if name is None:
        return
    fn = index.function_of(node)
    names = ctx.memo(("backward-names", fn), lambda: backward_names(index, fn))
    if name in names:
        return  # the sum is what backward() is called on: one graph on purpose
    step_loop = index.step_loop_of(node) or loop
    step_range = (step_loop.node.lineno, step_loop.node.end_lineno or step_loop.node.lineno)
    base = name.split(".", 1)[0]
    # Reset inside the step loop, before the accumulation or after it (`running_loss = 0` once the optimizer has
    # stepped): nothing survives the step.
    scope_defs = index.defs(index.scope_of(node))
    for stmt, _value in scope_defs.get(name, []) + ([] if base == name else scope_defs.get(base, [])):
        if step_range[0] <= stmt.lineno <= step_range[1] and stmt is not node and (
                stmt.lineno < node.lineno or _reset_with_the_step(index, stmt, step_loop)):  # type: ignore[attr-defined]
            return
    if _reset_each_update(index, node, step_loop, name):
        return
    for value in values:
        if holds_graph(index, value, node, names):
            ctx.report(node, variable=name, value=ctx.segment(value, 40))
            return
    _leave_external_accumulation(ctx, node, found)


_DROPS_GRAPH = frozenset({"item", "detach", "tolist", "numpy", "float", "int"})


def _accumulated_in_methods(ctx: Context) -> None:
    """A training loop hands its loss to a helper object's method that adds its argument into an attribute
    (horovod's ImageNet example: `train_loss.update(loss)`, and `Metric.update(self, val)` does
    `self.sum += hvd.allreduce(val.cpu())`): the attribute lives across steps, so every step's graph does too.
    Reported at the accumulation, which is the line to change. When the helper's class is imported, the
    project pass joins what this loop hands in with what that class's method keeps (`keeps-argument`)."""
    index = ctx.index
    done: set[int] = set()
    seen: set[ast.Call] = set()  # a call of a nested loop is also a call of the loop around it
    for loop in index.training_loops():
        for call in loop.all_calls():
            if call in seen or index.grad_disabled(call) or not isinstance(call.func, ast.Attribute):
                continue
            seen.add(call)
            method = index.instance_method(call)
            if method is None:
                _leave_handed_to_method(ctx, call)
                continue
            params = [a.arg for a in method.args.posonlyargs + method.args.args][1:]  # type: ignore[attr-defined]
            for stmt, positions in _kept_in_attributes(method, params):
                if id(stmt) in done:
                    continue
                handed = [call.args[p] for p in positions if p < len(call.args)]
                fn = index.function_of(call)
                names = ctx.memo(("backward-names", fn), lambda fn=fn: backward_names(index, fn))
                if any(holds_graph(index, arg, call, names) for arg in handed):
                    done.add(id(stmt))
                    # the value is the loss the loop at `call` hands in, e.g. `hvd.allreduce(val.cpu(), ...)`
                    target = stmt.target if isinstance(stmt, ast.AugAssign) else stmt.func.value  # type: ignore[attr-defined]
                    value = stmt.value if isinstance(stmt, ast.AugAssign) else stmt.args[0]  # type: ignore[attr-defined]
                    ctx.report(stmt, variable=_accumulator_name(target) or "self", value=ctx.segment(value, 40))


def _outputs_kept_for_epoch_end(ctx: Context) -> None:
    """A LightningModule that overrides `training_epoch_end` (Lightning 1.x; 2.0 removed the hook): Lightning
    keeps what every `training_step` returns for the whole epoch and hands the list to that hook. Since 1.6 it
    detaches only the "loss" entry of a returned dict (its CHANGELOG: "Removed the automatic detachment of
    extras returned from training_step"), so any other entry that holds its graph keeps that step's graph
    alive until the epoch ends (pdearena #4: `return {"loss": loss, "scalar_loss": scalar_loss, ...}`).
    Reported at the entry, the line to change."""
    index = ctx.index
    if not (index.uses("lightning") or index.uses("pytorch_lightning")):
        return
    for info in index.classes.values():
        step, epoch_end = info.method("training_step"), info.method("training_epoch_end")
        if step is None or epoch_end is None:  # Lightning collects the outputs when the hook is overridden
            continue
        if info.method("training_step_end") is not None:
            continue  # the hook then receives what training_step_end returns, not these dicts
        returned = [r for r in index.returns_of(step) if isinstance(r, ast.Dict)]
        for d in returned:
            # Lightning runs backward on the "loss" entry: what it is built from is the step's loss
            names = {n.id for k, v in zip(d.keys, d.values, strict=True) if _key(k) == "loss"
                     for n in ast.walk(v) if isinstance(n, ast.Name)}
            for k, v in zip(d.keys, d.values, strict=True):
                key = _key(k)
                if key is None or key == "loss":
                    continue
                if holds_graph(index, v, d, names):
                    ctx.report(v, variable=f'outputs["{key}"]', value=ctx.segment(v, 40))


def _key(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _kept_in_attributes(method: ast.AST, params: list[str]) -> list[tuple[ast.AST, list[int]]]:
    """(statement, parameter positions) where a method keeps what it is handed in an attribute of its object:
    `self.sum += val * n`, `self.losses[key] += val`, `self.D_loss.append(l_D)` (DeblurGANv2's MetricCounter)."""
    found: list[tuple[ast.AST, list[int]]] = []
    kinds = (ast.AugAssign, ast.Call)  # what `_accumulation` can read (an Assign is skipped below)
    for stmt in subtree(method):
        if stmt.__class__ not in kinds:
            continue
        positions = _kept_at(stmt, params)
        if positions:
            found.append((stmt, positions))
    return found


def _kept_at(stmt: ast.AST, params: list[str]) -> list[int]:
    """The parameter positions one `+=` statement or `.append`/`.extend` call keeps in an attribute of `self`."""
    kept = _accumulation(stmt)
    if kept is None or isinstance(stmt, ast.Assign):
        return []
    name = _accumulator_name(kept[0]) or ""
    if not name.startswith("self."):
        return []
    return sorted({p for value in kept[1] for p in _parameters_kept(value, params)})


def _leave_handed_to_method(ctx: Context, call: ast.Call) -> None:
    """`self.metric_counter.add_losses(loss_G.item(), loss_D[0], ...)` where the counter's class is imported: the
    argument positions that hold the graph, for the project pass to match with what that method keeps."""
    index = ctx.index
    found = index.receiver_class(call)
    if found is None:
        return
    built, path = found
    if isinstance(built, ast.Name) and built.id in index.classes:
        return  # this file's class: `_accumulated_in_methods` reads its method itself
    qualified = index.resolve(built)
    if qualified is None or qualified.split(".", 1)[0] in ("torch", "numpy", "np", "math"):
        return
    fn = index.function_of(call)
    names = ctx.memo(("backward-names", fn), lambda: backward_names(index, fn))
    positions = [i for i, arg in enumerate(call.args) if holds_graph(index, arg, call, names)]
    if positions:
        ctx.leave("hands-graph-to-method", {
            "class": qualified, "path": path, "method": call.func.attr, "positions": positions,  # type: ignore[attr-defined]
            "line": call.lineno, "col": call.col_offset + 1, "variable": dotted(call.func.value) or "self",  # type: ignore[attr-defined]
            "value": ctx.segment(call.args[positions[0]], 40)})


def _leave_kept_arguments(ctx: Context) -> None:
    """For the project pass: methods of this file's helper classes (not modules, not autograd Functions) that keep
    an argument in an attribute, with the argument positions; and the class each of their `self.x` holds when
    every assignment builds one (`self.losses_track = LossesTrackEpoch(n)`), to follow `metrics.losses_track`.
    Read from the file's `+=` statements and `.append`/`.extend` calls, not by walking every method."""
    index = ctx.index
    helpers = {info.node: info for info in index.classes.values() if not (info.is_module or info.is_function)}
    if not helpers:
        return
    kept: dict[tuple[str, str], set[int]] = {}
    for node in [*index.nodes(ast.AugAssign), *index.method_calls("append"), *index.method_calls("extend")]:
        fn = index.function_of(node)
        info = helpers.get(index.parents.get(fn)) if fn is not None else None  # type: ignore[arg-type]
        if info is None:
            continue
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]  # type: ignore[union-attr]
        # the node alone, not its subtree: an `.append` nested in it is in the list itself, in the same method
        positions = _kept_at(node, params)
        if positions:
            kept.setdefault((info.name, fn.name), set()).update(positions)  # type: ignore[union-attr]
    for (cls, method), positions in sorted(kept.items()):
        ctx.leave("keeps-argument", {"class": cls, "method": method, "positions": sorted(positions)})
    for info in helpers.values():
        built: dict[str, list[ast.expr]] = {}
        for a in index.self_assignments(info, None):
            built.setdefault(a.attr, []).append(a.value)
        for attr, values in sorted(built.items()):
            callee = one_constructor(values)
            if callee is None:
                continue
            local = isinstance(callee, ast.Name) and callee.id in index.classes
            name = callee.id if local else index.resolve(callee)  # type: ignore[attr-defined]
            if name is not None and not name.startswith("torch."):
                ctx.leave("attribute-class", {"class": info.name, "attr": attr, "built": name, "local": local})


def _parameters_kept(value: ast.AST, params: list[str]) -> list[int]:
    """The positions of the parameters `value` is built from when nothing on the way drops their graph
    (`.item()`, `.detach()`, `float(...)`). Several: an average meter's `self.sum += val * n` keeps `val`'s graph
    whatever the count `n` is (LIC-HPCM's `loss.update(out_criterion["loss"])`); the caller checks which of
    them it hands a graph."""
    for sub in ast.walk(value):
        if isinstance(sub, ast.Call) and (isinstance(sub.func, ast.Attribute) and sub.func.attr in _DROPS_GRAPH
                                          or isinstance(sub.func, ast.Name) and sub.func.id in _DROPS_GRAPH):
            return []
    used = {n.id for n in ast.walk(value) if isinstance(n, ast.Name) and n.id in params}
    return sorted(params.index(u) for u in used)


def _reset_each_update(index: Index, node: ast.AST, loop, name: str) -> bool:
    """Gradient accumulation inside one update (lightweight-gan's `train()`): the micro-step loop runs a backward
    each time, the optimizer steps once right after it, and the total is set afresh just before it, so what it
    keeps lives for one update, not step over step."""
    if not loop.has_backward or loop.has_step:
        return False
    outer = loop.parent
    fn = index.function_of(node)
    end = loop.node.end_lineno or loop.node.lineno
    if not any(index.function_of(c) is fn and index.loop_of(c) is outer and c.lineno > end for c in index.step_calls):
        return False
    base = name.split(".", 1)[0]
    defs = index.defs(index.scope_of(node))
    return any(stmt.lineno < loop.node.lineno and index.loop_of(stmt) is outer
               for stmt, _value in defs.get(name, []) + ([] if base == name else defs.get(base, [])))


def _leave_external_accumulation(ctx: Context, node: ast.AST, found: tuple[ast.AST, list[ast.expr]]) -> None:
    """`losses = train_util.train_step(...)`, `total_loss += total`: a method of another file; the project pass
    knows whether what it returns holds the graph."""
    target, values = found
    name = _accumulator_name(target)
    if name is None:
        return
    for value in values:
        found = _external_origin(ctx.index, value, node)
        if found is not None:
            callee, position = found
            ctx.leave("accumulates-call", {"callee": callee, "line": node.lineno, "col": node.col_offset + 1,  # type: ignore[attr-defined]
                                           "variable": name, "value": ctx.segment(value, 40), "position": position})
            return


def _external_origin(index: Index, value: ast.AST, at: ast.AST, depth: int = 0,
                     position: int | None = None) -> tuple[str, int | None] | None:
    """The name of the method of another object (not this file's, not torch's) a value comes straight from, and
    the position it takes in what that method returns when it is unpacked from a tuple:
    `total` <- `rpn_loc, ..., total = losses` <- `losses = train_util.train_step(imgs, ...)` -> ("train_step", None);
    `loss += step_loss / k` <- `step_loss, _, summary = model.train(feed)` -> ("train", 0) (ULTRA's main.py)."""
    if depth > 3:
        return None
    if isinstance(value, ast.Name):
        origin = latest_value(index, value.id, value)
        if origin is None:
            return None
        return _external_origin(index, origin, origin, depth + 1, _unpacked_position(index, value))
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        # `step_loss / args.steps_per_checkpoint`: the running total keeps what the tensor operand keeps
        for side in (value.left, value.right):
            found = _external_origin(index, side, at, depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and index.local_target(value) is None:
        q = index.resolve(value.func) or ""
        if q.split(".", 1)[0] in ("torch", "numpy", "np", "math") or value.func.attr in ("item", "detach", "cpu"):
            return None
        return value.func.attr, position
    return None


def _unpacked_position(index: Index, name: ast.Name) -> int | None:
    """`name`'s position in the tuple target of the assignment that last set it (`a, b = f()` -> 1 for b)."""
    here = index.statement_of(name) or name
    at = (getattr(here, "lineno", 0), getattr(here, "col_offset", 0))
    found = [s for s, _v in index.defs(index.scope_of(name)).get(name.id, []) if (s.lineno, s.col_offset) < at]
    stmt = found[-1] if found else None
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Tuple):
        return None
    elts = stmt.targets[0].elts
    if any(isinstance(e, ast.Starred) for e in elts):
        return None
    return next((i for i, e in enumerate(elts) if isinstance(e, ast.Name) and e.id == name.id), None)


def _leave_graph_returns(ctx: Context) -> None:
    """For the project pass: methods of this file that run a backward and return what still holds the graph
    (`def train_step(self, ...): losses = self.forward(...); losses.total_loss.backward(); return losses`), and
    methods that return an attribute some method of their class runs the backward on, alone or in a tuple
    (ULTRA's `DLA.train()`: `self.separate_gradient_update()` calls `self.loss.backward()`, then
    `return self.loss, None, self.train_summary`), with the tuple positions that hold it."""
    index = ctx.index
    done: set[ast.AST] = set()
    attributes: dict[ast.ClassDef, set[str]] = {}  # class -> the `self.x` it runs backward on
    for call in index.backward_calls:
        info = index.class_of(call)
        if info is not None and isinstance(call.func, ast.Attribute):
            d = dotted(call.func.value) or ""
            if d.startswith("self.") and d.count(".") == 1:
                attributes.setdefault(info.node, set()).add(d)
        fn = index.function_of(call)
        if fn is None or fn in done:
            continue
        done.add(fn)
        names = backward_names(index, fn)
        if any(holds_graph(index, r, r, names) for r in index.returns_of(fn)):
            ctx.leave("returns-graph", fn.name)
    for cls, held in attributes.items():
        for method in cls.body:
            if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) or method in done:
                continue
            positions: set[int] = set()
            for r in index.returns_of(method):
                elements = r.elts if isinstance(r, ast.Tuple) else [r]
                positions |= {i for i, e in enumerate(elements) if dotted(e) in held}
            if positions:
                ctx.leave("returns-graph-at", {"name": method.name, "positions": sorted(positions)})


@project("TD101")
def graph_accumulated_across_files(project: Project) -> list[ProjectHit]:
    """train.py adds what `train_util.train_step(...)` returns into a running total; trainer.py's train_step runs
    the backward on those losses and returns them with their graph."""
    returning = {name for _f, name in project.facts("returns-graph")}
    at: dict[str, set[int]] = {}  # methods returning a backpropagated attribute, by the tuple positions holding it
    for _f, fact in project.facts("returns-graph-at"):
        at.setdefault(fact["name"], set()).update(fact["positions"])
    if not returning and not at:
        return []

    def keeps(fact: dict) -> bool:
        if fact["callee"] in returning:
            return True
        positions = at.get(fact["callee"])
        return positions is not None and (fact.get("position") in positions
                                          or fact.get("position") is None and positions == {0})

    return [ProjectHit(f.path, fact["line"], fact["col"], {"variable": fact["variable"], "value": fact["value"]})
            for f, fact in project.facts("accumulates-call") if keeps(fact)]


@project("TD101")
def graph_handed_to_helpers_of_other_files(project: Project) -> list[ProjectHit]:
    """The loop hands a graph-holding tensor to a helper object whose class, in another file of the project, keeps
    that argument in an attribute (`MetricCounter.add_losses` appending `l_D` to `self.D_loss`). Reported at the
    call: the helper is fine with numbers, what the loop hands it is the line to change."""
    hits: list[ProjectHit] = []
    for f, fact in project.facts("hands-graph-to-method"):
        kept: set[int] = set()
        classes = project.defining(fact["class"])
        for attr in fact.get("path", ()):  # `metrics.losses_track`: the class Metrics keeps in that attribute
            held: list[tuple[ProjectFile, str]] = []
            for defining, local in classes:
                for a in defining.facts.get("attribute-class", ()):
                    if a["class"] == local and a["attr"] == attr:
                        held += [(defining, a["built"])] if a["local"] else project.defining(a["built"])
            classes = held
        for defining, local in classes:
            for keeps in defining.facts.get("keeps-argument", ()):
                if keeps["class"] == local and keeps["method"] == fact["method"]:
                    kept.update(keeps["positions"])
        if kept & set(fact["positions"]):
            hits.append(ProjectHit(f.path, fact["line"], fact["col"],
                                   {"variable": f"{fact['variable']}.{fact['method']}", "value": fact["value"]}))
    return hits


def _reset_with_the_step(index: Index, stmt: ast.AST, loop) -> bool:
    """A reset after the accumulation that runs on every optimizer step: unconditional in the loop, or in the
    block that steps the optimizer (`if (i + 1) % accum == 0: optimizer.step(); ...; running_loss = 0`). A reset
    every N log steps (`if i % 100 == 0: print(total / 100); total = 0`) keeps N steps of graphs alive."""
    parent = index.parent(stmt)
    while parent is not None and parent is not loop.node and not isinstance(parent, ast.If):
        parent = index.parent(parent)
    if parent is None or parent is loop.node:
        return True
    steps = set(index.step_calls)
    return any(isinstance(n, ast.Call) and n in steps for n in ast.walk(parent))


@rule("TD102", ast.Module)
def validation_without_no_grad(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    frozen = {dotted(c.func.value) for c in index.method_calls("requires_grad_") if isinstance(c.func, ast.Attribute) and is_constant(kwarg(c, "requires_grad", 0), False)}
    validation = index.validation_loops()
    inner = {id(child) for lp in validation for child in lp.children}
    for loop in validation:
        if id(loop) in inner and loop.parent is not None and loop.parent.validation:
            continue  # a loop inside an evaluation loop: the outer one's finding covers it
        for call in loop.all_calls():
            if not index.call_runs_model(call):
                continue
            if index.model_run_method(call) is not None:
                continue  # `model.generate(...)`: Hugging Face's and minGPT's generate run under no_grad themselves
            path = _model_call_path(index, call)
            model_call = path[-1] if path else None
            if model_call is not None and _parameter_free(index, model_call):
                continue  # `similarity(enrol, test)` with nn.CosineSimilarity: nothing to record a graph for
            # `self.prediction_step(...)` whose body runs `self.compute_loss(model, ...)` under no_grad, which
            # runs `model(**inputs)`: any call on the way to the model turning grad off is enough
            if index.grad_disabled(call) or any(index.grad_disabled(c) for c in path) \
                    or dotted(model_call.func if model_call is not None else call.func) in frozen:
                break
            shown = dotted(call.func) or ctx.segment(call.func, 40) or "model"
            values = {"variable": shown, "loader": loop.source or "the validation data", "practice": ""}
            fn = outermost_uncalled(index, call)
            if fn is not None:
                # `def evaluate(model, loader)` that no call in this file runs: another file may call it inside
                # `with torch.no_grad():`; the project pass asks every call site
                defer(ctx, call, fn, "no_grad", values, key="TD102-deferred")
            else:
                ctx.report(call, **values)
            break
    leave_sites(ctx)
    _flag_shared_loops(ctx, {id(lp) for lp in validation})
    practice.leave_evaluations(ctx)
    practice.note_covered(ctx, "TD102")


@project("TD102")
def validation_without_no_grad_across_files(project: Project) -> list[ProjectHit]:
    """An evaluation function of one file that every call in the project runs under no_grad records no graph."""
    return settle(project, "TD102-deferred")


@project("TD102")
def evaluation_unlike_the_projects_others(project: Project) -> list[ProjectHit]:
    """An evaluation function that runs the model with autograd on where the project's other evaluation functions
    turn it off (semantic/practice.py): whatever its shape, the project's own practice says it is an oversight."""
    return practice.hits(project, "grad_off", lambda site, text: {
        "variable": site["variable"], "loader": site["loader"], "practice": f", while {text}"})


def _flag_shared_loops(ctx: Context, reported: set[int]) -> None:
    """One loop for training and evaluation, keyed on a phase decided at run time (phases.py): the target of
    `for phase in ['train', 'val']:` around it, or a parameter of its function that the file's calls set to a
    training and an evaluation value (particleflow's `train_and_valid(..., is_train)`, `step('val', ...)`). The
    loop calls backward and steps only in the training pass; in the evaluation pass the forward still runs, and
    with autograd on unless something keyed on the phase turns it off (`with torch.set_grad_enabled(phase ==
    'train'):`, the usual fix) or `torch.no_grad()` covers it."""
    index = ctx.index
    steps = set(index.backward_calls) | set(index.step_calls)
    done: set[int] = set()
    for loop in index.loops.values():
        if id(loop) in reported or not (loop.has_backward or loop.has_step):
            continue
        fn = index.function_of(loop.node)
        phases = [index.loop_phase(loop)]
        if fn is not None:
            phases.append(index.parameter_phase(fn))
        for phase in phases:
            if phase is None:
                continue
            mine = [c for c in loop.all_calls() if c in steps]
            training = [v for v in phase.values if v not in phase.evaluation]
            if not any(index.runs_in_phase(c, phase, v) for c in mine for v in training):
                continue
            for value in phase.evaluation:
                if any(index.runs_in_phase(c, phase, value) for c in mine):
                    continue  # the evaluation pass steps too: another claim
                call = _recording_forward(index, loop, phase, value)
                if call is None or id(call) in done:
                    continue
                done.add(id(call))
                shown = dotted(call.func) or ctx.segment(call.func, 40) or "model"
                source = None
                if phase.origins:
                    origin = phase.origins[0]
                    source = _argument_for(index, fn, origin, loop.source) or next(
                        (dotted(a) for a in origin.args if looks_like_loader(dotted(a))), None)
                iterated = loop.source or ctx.segment(getattr(loop.node, "iter", loop.node), 40)
                values = {"variable": shown, "loader": source or iterated or "the evaluation data", "practice": ""}
                # `def val(self, loader): return self.run_epoch('val', ...)` that no call of this file runs: the
                # other files' calls of it say whether it runs under no_grad (the project pass asks them)
                callers = {id(c): outermost_uncalled(index, c) for c in phase.origins}
                if all(index.grad_disabled(c) or callers[id(c)] is not None for c in phase.origins) \
                        and phase.origins:
                    deferred = [callers[id(c)] for c in phase.origins if not index.grad_disabled(c)]
                    if not deferred:
                        continue  # every evaluation call of this file runs under no_grad
                    defer(ctx, call, deferred[0], "no_grad", values, key="TD102-deferred")
                else:
                    ctx.report(call, **values)
                break


def _recording_forward(index: Index, loop, phase, value) -> ast.Call | None:
    """The first model call of the loop that runs in the pass where the phase holds `value` with autograd on."""
    for call in loop.all_calls():
        if not index.call_runs_model(call) or index.model_run_method(call) is not None:
            continue
        if not index.runs_in_phase(call, phase, value):
            continue
        path = _model_call_path(index, call)
        if path and _parameter_free(index, path[-1]):
            continue
        if index.grad_disabled(call) or any(index.grad_disabled(c) for c in path) \
                or index.grad_off_in_phase(call, phase, value) or _grad_follows(index, call, index.function_of(call)):
            return None
        return call
    return None


def _grad_follows(index: Index, node: ast.AST, fn: ast.AST) -> bool:
    """Under `with torch.set_grad_enabled(<not a literal>):`: grad follows the caller's choice."""
    for anc in index.ancestors(node):
        if anc is fn:
            return False
        if isinstance(anc, WITHS) and any(
                isinstance(item.context_expr, ast.Call)
                and index.resolve(item.context_expr.func) in index.names["set_grad_enabled"]
                and not isinstance(kwarg(item.context_expr, "mode", 0), ast.Constant) for item in anc.items):
            return True
    return False


def _argument_for(index: Index, fn: ast.AST, call: ast.Call, param: str | None) -> str | None:
    """What `call` passes for the parameter `param` of `fn` (`valid_loader` for `data_loader`)."""
    if param is None:
        return None
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]  # type: ignore[attr-defined]
    if param not in names:
        return None
    offset = 1 if names and names[0] in ("self", "cls") and isinstance(call.func, ast.Attribute) else 0
    position = names.index(param) - offset
    if 0 <= position < len(call.args):
        return dotted(call.args[position])
    return next((dotted(k.value) for k in call.keywords if k.arg == param), None)


def _parameter_free(index: Index, call: ast.Call) -> bool:
    """A call of a binding built from an nn module that holds no parameters (vocabulary.toml)."""
    b = index.binding(call.func) if isinstance(call.func, ast.Name | ast.Attribute) else None
    return b is not None and b.cls in index.names["parameter_free_layers"]


def _model_call_path(index: Index, call: ast.Call, depth: int = 0) -> list[ast.Call]:
    """The calls from `call` to the model call itself: [call] when it calls a model, else `call` and the path
    inside the local function it calls (`self._eval_step(batch)` -> `self.model["generator"](z, c)`), to the
    first model call found; [] when there is none."""
    if isinstance(call.func, ast.Name | ast.Attribute | ast.Subscript) and index.is_model(call.func):
        return [call]
    target = index.local_target(call) if depth < 2 else None
    if target is None:
        return []
    for inner in index.calls_in(target):
        found = _model_call_path(index, inner, depth + 1)
        if found:
            return [call, *found]
    return []


_EMPTY_CACHE = ("torch.cuda.empty_cache", "torch.mps.empty_cache", "torch.xpu.empty_cache")


@rule("TD103", ast.Call, callees=_EMPTY_CACHE)
def empty_cache_in_training_loop(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    if index.callee(node) not in _EMPTY_CACHE:
        return
    loop = index.step_loop_of(node)
    if loop is None:
        return
    for anc in index.ancestors(node):
        if anc is loop.node:
            break
        if isinstance(anc, ast.ExceptHandler):
            return  # recovering from an OOM: the one place it belongs
        if isinstance(anc, ast.If) and any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(anc.test)
        ):
            return  # every N steps: a deliberate, cheap choice
    where = f"the loop over `{loop.source}`" if loop.source else "the training loop"
    ctx.report(node, variable=ctx.segment(node), loop=where)


@rule("TD104", ast.Module, reads=(ast.Assign,))
def hidden_state_not_detached(node: ast.Module, ctx: Context) -> None:
    # `h = rnn(x, h)`: only a call an assignment binds can carry its state. One loop over the file's assignments
    # (in the walk's order, which is their calls' order) instead of a check called on every call of the file.
    call_cls = ast.Call
    for assign in ctx.index.nodes(ast.Assign):
        value = assign.value  # type: ignore[attr-defined]
        if value.__class__ is call_cls and len(assign.targets) == 1 and (value.args or value.keywords):  # type: ignore[attr-defined]
            _hidden_state_not_detached(value, assign, ctx)  # type: ignore[arg-type]


def _hidden_state_not_detached(node: ast.Call, assign: ast.Assign, ctx: Context) -> None:
    index = ctx.index
    passed = {a.id for a in [*node.args, *(k.value for k in node.keywords)] if isinstance(a, ast.Name)}
    if not passed:
        return
    target = assign.targets[0]
    # the usual `h = rnn(x, h)` needs no walk of its one-name target
    outputs = ({target.id} if isinstance(target, ast.Name)
               else {n.id for n in subtree(target) if isinstance(n, ast.Name)}) & passed
    carried = [a.id for a in [*node.args, *(k.value for k in node.keywords)] if isinstance(a, ast.Name) and a.id in outputs]
    if not carried or not isinstance(node.func, ast.Name | ast.Attribute) or not index.is_model(node.func):
        return
    loop = index.step_loop_of(node)
    if loop is None or not loop.has_backward or index.grad_disabled(node):
        return
    state = carried[0]
    start, end = loop.node.lineno, loop.node.end_lineno or loop.node.lineno
    scope = index.scope_of(node)
    for stmt, _ in index.defs(scope).get(state, []):
        if stmt is not assign and start <= stmt.lineno <= end:
            return  # re-initialised or detached inside the loop
    for call in loop.all_calls():
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "detach_":
            target = func.value.value if isinstance(func.value, ast.Subscript) else func.value
            if dotted(target) == state:  # `hidden.detach_()`, or each part of a tuple: `hidden[0].detach_()`
                return
        called = (dotted(func) or "").lower()
        if ("detach" in called or "repackage" in called) and any(dotted(a) == state for a in call.args):
            return
    ctx.report(node, variable=state, model=dotted(node.func) or "model")


@rule("TD105", ast.Call, callees=("torch.autograd.backward",), methods=("backward", "manual_backward"))
def retain_graph_in_loop(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    if node not in ctx.memo("backward-set", lambda: set(index.backward_calls)):
        return
    retain = kwarg(node, "retain_graph", 1 if isinstance(node.func, ast.Attribute) else 2)
    if not is_constant(retain, True) or is_constant(kwarg(node, "create_graph"), True):
        return
    loop = index.step_loop_of(node)
    if loop is None:
        return
    backward_set = ctx.memo("backward-set", lambda: set(index.backward_calls))
    calls = list(loop.all_calls())
    if sum(1 for c in calls if c in backward_set) != 1:
        return  # several backward passes over a shared graph need it
    if any(index.callee(c) in ("torch.autograd.grad",) for c in calls):
        return
    if isinstance(node.func, ast.Attribute) and index.resolve(node.func.value) not in (None, "torch.autograd"):
        return  # a module's backward function (distributed autograd, ...), not a tensor's
    fn = index.function_of(node)
    if not any(index.function_of(c) is fn for c in index.step_calls):
        return  # no optimizer step here: not a training step (tests, gradient checks)
    receiver = node.func.value if isinstance(node.func, ast.Attribute) else (node.args[0] if node.args else node)
    ctx.report(node, variable=ctx.segment(receiver, 40))

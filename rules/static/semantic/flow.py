"""Simple data flow: what a name was assigned in a function, and who calls a function of the file."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import (
    FUNCTIONS,
    _pairs,
    _position,
    dotted,
    stmt_position,
)

if TYPE_CHECKING:
    pass


class Flow:
    """Assignments by scope, definitions before a point, callers of local functions and methods."""

    def assignments_in_order(self) -> list[ast.stmt]:
        """Every `=` and annotated assignment of the file in source order, sorted once per file: the bindings, the
        scoped table (`defs`), the classes' `self.x = ...` and the late copies all read them in this order. Not to
        be changed by a caller."""
        if self._in_order is None:
            self._in_order = sorted(self.nodes(ast.Assign) + self.nodes(ast.AnnAssign), key=stmt_position)
        return self._in_order

    def defs(self, scope: ast.AST) -> dict[str, list[tuple[ast.stmt, ast.expr]]]:
        """Assignments `name = value` in a scope, by name, in source order (tuple targets unpacked)."""
        if self._defs is None:
            table: dict[ast.AST, dict[str, list[tuple[ast.stmt, ast.expr]]]] = {}
            for stmt in self.assignments_in_order():
                if stmt.value is None:
                    continue
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                where = table.setdefault(self.scope_of(stmt), {})
                for target in targets:
                    for name_node, value in _pairs(target, stmt.value):
                        where.setdefault(name_node, []).append((stmt, value))
            self._defs = table
        return self._defs.get(scope, {})

    def assigned_names(self) -> frozenset[str]:
        """Every name some scope of the file assigns (the keys of `defs`): a name outside it has no definition
        and no closure value anywhere."""
        if self._assigned_names is None:
            # the keys of `assigned_values` are those of `defs` (the same targets, unpacked by the same `_pairs`):
            # a question that only rules a name out (most names handed to calls) never pays for the scoped table
            self._assigned_names = frozenset(self.assigned_values())
        return self._assigned_names

    def assigned_values(self) -> dict[str, list[ast.expr]]:
        """Every name some assignment of the file binds (tuple targets unpacked, as `defs` does), with the values it
        is given, in no particular order and with no scopes. One pass, far cheaper than `defs` (no scope looked up
        per statement, no sort): a question that needs one kind of value (a list of phase names, a class call) rules
        most names out here before asking `defs` which assignment reaches a point."""
        if self._values is None:
            found: dict[str, list[ast.expr]] = {}
            name_cls = ast.Name
            for stmt in self.nodes(ast.Assign) + self.nodes(ast.AnnAssign):
                value = stmt.value  # type: ignore[attr-defined]
                if value is None:
                    continue
                for target in stmt.targets if stmt.__class__ is ast.Assign else [stmt.target]:  # type: ignore[attr-defined]
                    if target.__class__ is name_cls:  # most targets: no generator for them
                        found.setdefault(target.id, []).append(value)
                        continue
                    for name, part in _pairs(target, value):
                        found.setdefault(name, []).append(part)
            self._values = found
        return self._values

    def assigned_a(self, name: str, kinds: type[ast.AST] | tuple[type[ast.AST], ...]) -> bool:
        """Whether some assignment of the file gives `name` a value of these node types (`ast.Call`)."""
        return any(isinstance(v, kinds) for v in self.assigned_values().get(name, ()))

    def definitions(self, name: str, at: ast.AST) -> list[ast.expr]:
        """Values assigned to `name` in the scope of `at` by statements before the one holding `at`
        (so `att = att.softmax(-1)` looks up the earlier `att`), in source order."""
        scope = self.scope_of(at)
        stmt = self.statement_of(at) or at
        here = (getattr(stmt, "lineno", 1 << 30), getattr(stmt, "col_offset", 0))
        return [value for s, value in self.defs(scope).get(name, []) if (s.lineno, s.col_offset) < here]

    def closure_value(self, name: str, at: ast.AST) -> ast.expr | None:
        """The value a function reads for a name it neither assigns nor takes as a parameter: the last
        assignment of the name in the innermost enclosing function that makes one (`model = Net()` in `main`,
        read by `def train(X, y): output = model(X)` inside it), else in the module (a global)."""
        fn = self.function_of(at)
        if fn is None or self.defs(fn).get(name):
            return None
        args = fn.args  # type: ignore[attr-defined]
        if name in {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}:
            return None
        scope = self.scope_of(fn)
        while isinstance(scope, FUNCTIONS):
            found = self.defs(scope).get(name)
            if found:
                return found[-1][1]
            scope = self.scope_of(scope)
        found = self.defs(self.tree).get(name) if isinstance(scope, ast.Module) else None
        return found[-1][1] if found else None

    def _local_function_calls(self) -> list[tuple[ast.Call, ast.AST]]:
        """(call, function) for calls of this file's functions and of methods through `self.`."""
        if self._local_calls is not None:
            return self._local_calls
        pairs: list[tuple[ast.Call, ast.AST]] = []
        # Functions defined inside functions, by (enclosing function, name): `def main(): def _train_epoch():
        # ... _eval_epoch() ...; def _eval_epoch(): ...` -- a closure calls its siblings by name.
        nested: dict[tuple[ast.AST, str], ast.AST] = {}
        for fn in self.nodes(ast.FunctionDef) + self.nodes(ast.AsyncFunctionDef):
            owner = self.scope_of(fn)
            if isinstance(owner, FUNCTIONS):
                nested.setdefault((owner, fn.name), fn)  # type: ignore[attr-defined]
        nested_names = {name for _, name in nested}  # a call by any other name finds no nested function
        # Only a call by one of those names, of a module-level function or of a method name some class defines can
        # make a pair: the calls index hands over those (in the walk's order, which the bindings' callers read in),
        # not every call of the file. A plain name is filed under itself unless an import claims the same name:
        # then every call is read.
        names = nested_names | self.functions.keys()
        methods = {fn.name for fn in self.nodes(ast.FunctionDef) + self.nodes(ast.AsyncFunctionDef)  # type: ignore[attr-defined]
                   if self.parents.get(fn).__class__ is ast.ClassDef}
        claimed = names & (self.aliases.keys() | self.vocab["conventional_aliases"].keys())
        calls = self.nodes(ast.Call) if claimed else self.calls_named(frozenset(names), frozenset(methods))
        for call in calls:
            func = call.func
            if isinstance(func, ast.Name) and func.id in nested_names:
                target = self._nested_target(call, func.id, nested)
                if target is not None:
                    pairs.append((call, target))
                    continue
            if isinstance(func, ast.Name) and func.id in self.functions:
                pairs.append((call, self.functions[func.id]))
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                info = self.class_of(call)
                if info is not None:
                    target = info.method(func.attr)
                    if target is not None:
                        pairs.append((call, target))
        self._local_calls = pairs
        return pairs

    def _nested_target(self, call: ast.Call, name: str, nested: dict[tuple[ast.AST, str], ast.AST]) -> ast.AST | None:
        """The function a bare-name call runs when an enclosing function defines it (Python's own lookup,
        innermost first)."""
        scope = self.function_of(call)
        while scope is not None:
            found = nested.get((scope, name))
            if found is not None:
                return found
            scope = self.function_of(scope)
        return None

    def receiver_class(self, call: ast.Call) -> tuple[ast.expr, list[str]] | None:
        """The class whose method `a.b.method(...)` runs, followed through attributes as far as this file can:
        (the constructor's callee, the attributes left to follow in another file). `metrics.losses_track.update(x)`
        with `metrics = Metrics(...)` imported gives (`Metrics`, ["losses_track"]): the project pass reads what
        `Metrics.__init__` stores in `self.losses_track` (SSA-SC's `LossesTrackEpoch`); with `Metrics` a class of
        this file, its `self.losses_track = LossesTrackEpoch(...)` is followed here and the path is empty."""
        func = call.func
        if not isinstance(func, ast.Attribute):
            return None
        receiver, path = func.value, []
        built = self.instance_class_of(receiver, call)
        while built is None and isinstance(receiver, ast.Attribute) and not (
                isinstance(receiver.value, ast.Name) and receiver.value.id == "self"):
            path.insert(0, receiver.attr)
            receiver = receiver.value
            built = self.instance_class_of(receiver, call)
        if built is None:
            return None
        while path and isinstance(built, ast.Name) and built.id in self.classes:
            info = self.classes[built.id]
            values = [a.value for a in self.self_assignments(info, None) if a.attr == path[0]]
            built = one_constructor(values)
            if built is None:
                return None
            path.pop(0)
        return built, path

    def instance_class(self, call: ast.Call) -> ast.expr | None:
        func = call.func
        if not isinstance(func, ast.Attribute):
            return None
        return self.instance_class_of(func.value, call)

    def instance_class_of(self, receiver: ast.expr, call: ast.AST) -> ast.expr | None:
        """The class `obj.method(...)` runs a method of, as this file spells it (the constructor's callee): every assignment of `obj`
        in its scope (or, failing that, at module level) builds an instance of one class (horovod's ImageNet
        example: `train_loss = Metric('train_loss')` ... `train_loss.update(loss)`), or `obj` is `self.x` and every
        `self.x = ...` of the class does (DeblurGANv2's `self.metric_counter = MetricCounter(name)` in `__init__`,
        `self.metric_counter.add_losses(...)` in the epoch loop). The class may be this file's (`Metric`) or an
        imported one (`MetricCounter`, `metrics.Meter`): `resolve` names the latter for the project pass."""
        if isinstance(receiver, ast.Name) and receiver.id != "self":
            values = [v for _s, v in self.defs(self.scope_of(call)).get(receiver.id, [])] or \
                [v for _s, v in self.defs(self.tree).get(receiver.id, [])]
        elif (isinstance(receiver, ast.Attribute) and isinstance(receiver.value, ast.Name)
              and receiver.value.id == "self"):
            info = self.class_of(call)
            if info is None:
                return None
            values = [a.value for a in self.self_assignments(info, None) if a.attr == receiver.attr]
        else:
            return None
        return one_constructor(values)

    def instance_method(self, call: ast.Call) -> ast.AST | None:
        """The method of a class of this file that `obj.method(...)` runs (`instance_class`). Not an nn.Module or
        autograd Function: calling those runs forward, not a helper."""
        found = self.receiver_class(call)
        built = found[0] if found is not None and not found[1] else None
        info = self.classes.get(built.id) if isinstance(built, ast.Name) else None
        if info is None or info.is_module or info.is_function:
            return None
        return info.method(call.func.attr)  # type: ignore[attr-defined]

    def handed_in(self, value: ast.expr) -> bool:
        """Whether this code receives `value` rather than builds it: a parameter of its function; `self.model`
        set from a constructor parameter (`self.model = model.to(device)`); or a name read out of a container a
        parameter holds, in every assignment of it in the function (drugVQA's `test(testArgs)` does
        `attention_model = testArgs['model']`, also `cfg.model`, `kwargs.get('model')`). Its class is the caller's,
        so the caller decides what it is and this code decides how it runs."""
        fn = self.function_of(value)
        if isinstance(value, ast.Name):
            if fn is None:
                return False
            params = _parameter_names(fn)
            if value.id in params:
                return True
            assigned = self.defs(fn).get(value.id, [])
            return bool(assigned) and all(_read_from(v, params) for _stmt, v in assigned)
        if not (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self"):
            return False
        info = self.class_of(value)
        init = info.method("__init__") if info is not None else None
        if init is None:
            return False
        params = _parameter_names(init) - {"self"}
        return any(a.attr == value.attr and _same_object_name(a.value) in params
                   for a in self.self_assignments(info, "__init__"))

    def constructor_parameter(self, info, attr: str) -> int | None:
        """The position (after `self`) of the constructor parameter `self.<attr>` is set from in `__init__`
        (`self.model = model`, `self.model = model.to(device)`), or None: what a caller hands the class at
        `Evaluator(self.model, loader)` is what its methods later run as `self.model` (hedwig's BertEvaluator)."""
        init = info.method("__init__")
        if init is None:
            return None
        params = [a.arg for a in init.args.posonlyargs + init.args.args][1:]
        for a in self.self_assignments(info, "__init__"):
            name = _same_object_name(a.value)
            if a.attr == attr and name in params:
                return params.index(name)
        return None

    def defined_outside(self, name: str, at: ast.AST, block: ast.AST) -> ast.stmt | None:
        """Where the value `name` holds at `at` comes from, when that is outside `block` (a statement around
        `at`): the last assignment before `at` in its scope when it precedes `block`, or the function itself when
        `name` is one of its parameters and nothing reassigns it before `at`. None when `block` assigns it (or
        nothing visible does): `loss` built inside `with model.no_sync():` is not from outside."""
        scope = self.scope_of(at)
        here = _position(self.statement_of(at) or at)
        assigned = [s for s, _v in self.defs(scope).get(name, []) if _position(s) < here]
        if assigned:
            last = assigned[-1]
            return last if _position(last) < _position(block) else None
        fn = self.function_of(at)
        if fn is not None and fn is scope and name in _parameter_names(fn):
            return fn
        return None

    def sync_disabling(self, expr: ast.AST, at: ast.AST, _depth: int = 0) -> str | None:
        """The model whose DDP gradient sync entering `expr` (a `with` item) switches off, or None:
        `model.no_sync()`; a name every earlier assignment of which gives one (or `contextlib.suppress()`, the
        usual no-op branch: ClassyVision's `ctx = model.no_sync() if not do_step else contextlib.suppress()`);
        a context function or method of this file that sets `require_backward_grad_sync` or enters `no_sync()`
        itself (speechbrain's `Brain.no_sync`, over all of the class's modules). FSDP's `no_sync()` acts in the
        backward, so it is not one."""
        if _depth > 3:
            return None
        if isinstance(expr, ast.IfExp):
            found = [self.sync_disabling(e, at, _depth + 1) for e in (expr.body, expr.orelse)]
            hits = [f for f in found if f]
            noop = [e for e in (expr.body, expr.orelse) if _noop_context(e)]
            return hits[0] if hits and len(hits) + len(noop) == 2 else None
        if isinstance(expr, ast.Name):
            values = self.definitions(expr.id, at)
            found = [self.sync_disabling(v, v, _depth + 1) for v in values]
            return found[-1] if values and all(found) else None
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr == "no_sync" and not expr.args:
            b = self.binding(func.value)
            if b is not None and b.wrapper == "fsdp":
                return None
            return dotted(func.value)
        target = self.local_target(expr)  # type: ignore[attr-defined]
        if target is None:
            return None
        for node in subtree(target):
            if isinstance(node, ast.Attribute) and node.attr == "require_backward_grad_sync" \
                    and isinstance(node.ctx, ast.Store) or isinstance(node, ast.Call) \
                    and isinstance(node.func, ast.Attribute) and node.func.attr == "no_sync":
                return dotted(func) or getattr(target, "name", None)
        return None

    def callers(self, fn: ast.AST) -> list[ast.Call]:
        """Calls of a function (or of a method through `self.`) in this file."""
        if self._callers is None:
            table: dict[ast.AST, list[ast.Call]] = {}
            for call, target in self._local_function_calls():
                table.setdefault(target, []).append(call)
            self._callers = table
        return self._callers.get(fn, [])


def _noop_context(expr: ast.AST) -> bool:
    """`contextlib.suppress()`, `nullcontext()`: a context that does nothing, the other branch of a choice."""
    name = dotted(expr.func) if isinstance(expr, ast.Call) else None
    return name is not None and name.rsplit(".", 1)[-1] in ("suppress", "nullcontext") and not expr.args  # type: ignore[attr-defined]


def _parameter_names(fn: ast.AST) -> set[str]:
    args = fn.args  # type: ignore[attr-defined]
    return {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}


def _same_object_name(expr: ast.AST) -> str | None:
    """`model` in `model`, `model.to(DEVICE)`, `model.cuda()` (the same object)."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in (
            "to", "cuda", "cpu", "float", "half", "double", "train"):
        expr = expr.func.value
    return expr.id if isinstance(expr, ast.Name) else None


def _read_from(value: ast.AST, params: set[str]) -> bool:
    """`args['model']`, `cfg.model`, `kwargs.get('model')` (and `.to(device)` of them) where `args`, `cfg`,
    `kwargs` are parameters: an item of a container the caller handed in."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in (
            "to", "cuda", "cpu", "float", "half", "double"):
        value = value.func.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "get":
        value = value.func.value
    elif isinstance(value, ast.Subscript | ast.Attribute):
        value = value.value
    else:
        return False
    return isinstance(value, ast.Name) and value.id in params


def one_constructor(values: list[ast.expr]) -> ast.expr | None:
    """The callee when every value builds an instance of one class (`Metric('loss')`, `metrics.Meter()`)."""
    built = [dotted(v.func) for v in values if isinstance(v, ast.Call)]
    if not values or len(built) != len(values) or None in built or len(set(built)) != 1:
        return None
    return values[0].func  # type: ignore[attr-defined]

"""TD8xx — custom autograd: torch.autograd.Function contracts (gradient count, ctx storage, .apply),
activation checkpointing's use_reentrant, and graph cuts inside a module's forward. Docs: autograd.toml."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from torchdoctor.rules.static.api import Context, project, rule
from torchdoctor.rules.static.index import FUNCTIONS, ClassInfo, Index, dotted, is_constant, kwarg
from torchdoctor.rules.static.patterns import latest_self_value
from torchdoctor.rules.static.project import Project, ProjectHit
from torchdoctor.rules.static.rules.profiling import snippet
from torchdoctor.rules.static.semantic import graphreach
from torchdoctor.rules.static.semantic.subtree import subtree

_CHECKPOINT = frozenset({"torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential"})
# Tensor methods and torch functions that return one tensor (what a backward usually returns).
_ONE_TENSOR_METHODS = frozenset(
    "clone mul mul_ div div_ add add_ sub neg mm bmm matmul t transpose permute sum mean expand expand_as reshape "
    "view view_as contiguous masked_fill masked_fill_ where unsqueeze squeeze float double half to type_as "
    "sign abs exp log sqrt pow clamp zero_ fill_ new_zeros new_ones zeros_like ones_like".split()
)
_TUPLE_FUNCTIONS = frozenset(
    {"torch.split", "torch.chunk", "torch.unbind", "torch.autograd.grad", "torch.tensor_split", "torch.broadcast_tensors"}
)
_TO_TENSOR = frozenset(
    {"torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor", "torch.FloatTensor", "torch.LongTensor"}
)
_NO_GRAPH_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "training"})
_NO_GRAPH_METHODS = frozenset({"size", "dim", "numel", "nelement", "get_device", "data_ptr", "stride"})
# Results with no gradient by nature (indices, comparisons, rounding): not a cut anyone could fix.
_NON_DIFFERENTIABLE = frozenset(
    "argmax argmin argsort round floor ceil sign long int bool eq ne gt lt ge le nonzero isnan isinf isfinite "
    "multinomial bernoulli".split()
)


def _function_class(ctx: Context, node: ast.ClassDef) -> ClassInfo | None:
    info = ctx.index.classes.get(node.name)
    return info if info is not None and info.node is node and info.is_function else None


def _positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    return [*fn.args.posonlyargs, *fn.args.args]


def _forward_inputs(info: ClassInfo) -> tuple[list[str], int] | None:
    """(input names, how many have no default) of `forward`, without `ctx`; None for `*args`."""
    forward = info.method("forward")
    if forward is None or forward.args.vararg is not None:
        return None
    params = _positional(forward)
    defaults = len(forward.args.defaults)
    if any(isinstance(d, ast.Name) and d.id == "classmethod" for d in forward.decorator_list):
        params = params[1:]  # `@classmethod def forward(cls, ctx, x, ...)` (PyTorch-Encoding's syncbn): cls, then ctx
    if "setup_context" not in info.methods:
        if not params:
            return None
        params = params[1:]  # ctx
    names = [p.arg for p in params]
    return names, len(names) - defaults


def _outputs_all_non_differentiable(info: ClassInfo) -> bool:
    """`forward` marks every value it returns with `ctx.mark_non_differentiable`: autograd never calls
    `backward` (an index or a neighbour search), so whatever it returns is never counted."""
    forward = info.method("forward")
    if forward is None:
        return False
    marked: set[str] = set()
    for node in subtree(forward):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "mark_non_differentiable"):
            marked.update(a.id for a in node.args if isinstance(a, ast.Name))
    if not marked:
        return False
    returns = _returns(forward)
    for ret in returns:
        values = ret.value.elts if isinstance(ret.value, ast.Tuple) else [ret.value]
        if not values or not all(isinstance(v, ast.Name) and v.id in marked for v in values):
            return False
    return bool(returns)


def _returns(fn: ast.AST) -> list[ast.Return]:
    """Return statements of a function, not of functions nested in it."""
    out: list[ast.Return] = []
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            out.append(node)
        if not isinstance(node, (*FUNCTIONS, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return sorted(out, key=lambda r: r.lineno)


def _count(index: Index, expr: ast.AST | None, fn: ast.AST, depth: int = 0) -> tuple[int, list[ast.expr] | None] | None:
    """(how many values a return expression holds, its elements when it is a literal), or None
    when we cannot tell."""
    if expr is None:
        return 1, None  # bare `return`: None
    if depth > 6:
        return None
    if isinstance(expr, ast.Tuple | ast.List):
        if any(isinstance(e, ast.Starred) for e in expr.elts):
            return None
        return len(expr.elts), list(expr.elts)
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.Add):  # `(None, None) + (grad,)`: tuples concatenate
            left, right = _count(index, expr.left, fn, depth + 1), _count(index, expr.right, fn, depth + 1)
            if left is None or right is None:
                return None
            if left[1] is not None or right[1] is not None:
                if left[1] is None or right[1] is None:
                    return None
                return left[0] + right[0], left[1] + right[1]
        if isinstance(expr.op, ast.Mult) and (isinstance(expr.left, ast.Tuple) or isinstance(expr.right, ast.Tuple)):
            return None
        return 1, None
    if isinstance(expr, ast.Constant | ast.UnaryOp | ast.Subscript):
        return 1, None
    if isinstance(expr, ast.IfExp):
        a, b = _count(index, expr.body, fn, depth + 1), _count(index, expr.orelse, fn, depth + 1)
        return a if a is not None and b is not None and a[0] == b[0] else None
    if isinstance(expr, ast.Name):
        values = index.definitions(expr.id, expr)
        if values:
            return _count(index, values[-1], fn, depth + 1)
        params = {a.arg for a in _positional(fn)}  # type: ignore[arg-type]
        return (1, None) if expr.id in params else None
    if isinstance(expr, ast.Call):
        q = index.resolve(expr.func)
        if q in _TUPLE_FUNCTIONS:
            return None
        if q is not None and q.startswith("torch."):
            return 1, None
        if isinstance(expr.func, ast.Attribute) and expr.func.attr in _ONE_TENSOR_METHODS:
            return 1, None
    return None


def _falls_off_end(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A body that does work and ends without returning: not a placeholder (`pass`, `...`, a docstring) and not
    one that ends in a raise (NotImplementedError and the like)."""
    body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    if not body or all(isinstance(st, ast.Pass) for st in body):
        return False
    return not any(isinstance(n, ast.Raise) for n in subtree(fn))


def _implicit_return(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.Return:
    """The `return None` a function without a return statement ends with, placed at its `def` line."""
    ret = ast.Return(value=None)
    ast.copy_location(ret, fn)
    ret.end_lineno, ret.end_col_offset = fn.lineno, fn.col_offset + len("def")
    return ret


def _wrong_count(count: int, elements: list[ast.expr] | None, expected: int) -> bool:
    """Autograd refuses fewer gradients than inputs, and more unless the extra ones are all None."""
    if count < expected:
        return True
    if count == expected or elements is None:
        return False
    return any(not (isinstance(e, ast.Constant) and e.value is None) for e in elements[expected:])


def _apply_sites(ctx: Context, name: str) -> list[ast.Call]:
    """Calls of `Name.apply(...)`, directly or through an alias (`my_op = Name.apply`)."""
    index = ctx.index
    aliases = {f"{name}.apply"}
    for stmt in index.nodes(ast.Assign):
        if dotted(stmt.value) == f"{name}.apply":
            aliases |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    return [c for a in sorted(aliases) for c in index.calls_by_name.get(a, [])]


@rule("TD801", ast.ClassDef)
def backward_gradient_count(node: ast.ClassDef, ctx: Context) -> None:
    info = _function_class(ctx, node)
    if info is None:
        return
    backward = info.method("backward") or info.method("vjp")
    found = _forward_inputs(info)
    if backward is None or found is None or _outputs_all_non_differentiable(info):
        return
    names, required = found
    total = len(names)
    passed = {
        len(c.args)
        for c in _apply_sites(ctx, node.name)
        if not any(isinstance(a, ast.Starred) for a in c.args) and not c.keywords
    }
    index = ctx.index
    # A backward that falls off its end returns None: one value, where the Function has len(names) inputs
    # (torch: "returned an incorrect number of gradients (expected 2, got 1)").
    returns: list[ast.Return] = _returns(backward) or ([_implicit_return(backward)] if _falls_off_end(backward) else [])
    for ret in returns:
        found = _count(index, ret.value, backward)
        if found is None:
            continue
        count, elements = found
        if passed:
            wrong = sorted(n for n in passed if _wrong_count(count, elements, n))
            if not wrong:
                continue
            expected = str(wrong[0])
        elif count >= required and not _wrong_count(count, elements, total):
            continue
        else:
            expected = str(total) if required == total else f"{required} to {total}"
        ctx.report(
            ret,
            variable=node.name,
            expected_inputs=expected,  # a number or a range ("2 to 4"): words for the message
            returned=count,
            inputs=", ".join(names) or "(none)",
        )


def _tensor_inputs(index: Index, info: ClassInfo, names: list[str]) -> set[str]:
    """Inputs that are tensors needing gradients: backward returns a non-None gradient in their
    position, an annotation says Tensor, or the Function has a single input."""
    forward = info.method("forward")
    annotated = set()
    if forward is not None:
        for a in _positional(forward):
            if a.annotation is not None and "Tensor" in (ast.unparse(a.annotation) if hasattr(ast, "unparse") else ""):
                annotated.add(a.arg)
    tensors = {n for n in names if n in annotated}
    if len(names) == 1:
        tensors.add(names[0])
    backward = info.method("backward") or info.method("vjp")
    if backward is not None:
        for ret in _returns(backward):
            value = ret.value
            if isinstance(value, ast.Tuple) and len(value.elts) == len(names):
                for name, elt in zip(names, value.elts, strict=True):
                    if not (isinstance(elt, ast.Constant) and elt.value is None):
                        tensors.add(name)
    return tensors


def _outputs(fn: ast.AST) -> set[str]:
    names: set[str] = set()
    for ret in _returns(fn):
        value = ret.value
        elts = value.elts if isinstance(value, ast.Tuple) else [value]
        names |= {e.id for e in elts if isinstance(e, ast.Name)}
    return names


def _ctx_stores(fn: ast.AST, ctx_name: str) -> list[tuple[ast.stmt, str, ast.expr]]:
    """(statement, attribute, value) for `ctx.attr = value` (and `ctx.a, ctx.b = a, b`)."""
    out = []
    for stmt in subtree(fn):
        if not isinstance(stmt, ast.Assign):
            continue
        for target in stmt.targets:
            pairs = []
            if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) and len(target.elts) == len(stmt.value.elts):
                pairs = list(zip(target.elts, stmt.value.elts, strict=True))
            else:
                pairs = [(target, stmt.value)]
            for t, v in pairs:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == ctx_name:
                    out.append((stmt, t.attr, v))
    return out


@rule("TD802", ast.ClassDef)
def tensor_stored_on_ctx(node: ast.ClassDef, ctx: Context) -> None:
    info = _function_class(ctx, node)
    if info is None:
        return
    found = _forward_inputs(info)
    if found is None:
        return
    names, _ = found
    index = ctx.index
    tensors = _tensor_inputs(index, info, names)
    forward = info.method("forward")
    setup = info.method("setup_context")
    outputs = _outputs(forward) if forward is not None else set()
    where: list[tuple[ast.AST, str, set[str], set[str]]] = []  # (method, ctx name, inputs, outputs)
    if setup is not None:
        params = [a.arg for a in _positional(setup)]
        if len(params) >= 3:
            ctx_name, inputs_name, output_name = params[:3]
            unpacked = _unpacked(setup, inputs_name)
            inputs = {unpacked[i] for i, n in enumerate(names) if i < len(unpacked) and n in tensors}
            where.append((setup, ctx_name, inputs, {output_name} | _unpacked_set(setup, output_name)))
    elif forward is not None:
        params = [a.arg for a in _positional(forward)]
        if params:
            where.append((forward, params[0], tensors, outputs))
    for method, ctx_name, inputs, outs in where:
        for stmt, attr, value in _ctx_stores(method, ctx_name):
            if not isinstance(value, ast.Name):
                continue
            if value.id in inputs:
                role = "an input"
            elif value.id in outs:
                role = "an output"
            else:
                continue
            ctx.report(stmt, variable=value.id, attr=attr, role=role, cls=node.name)


def _unpacked(fn: ast.AST, name: str) -> list[str]:
    """`x, w = inputs` -> ["x", "w"]."""
    for stmt in subtree(fn):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id == name:
            target = stmt.targets[0]
            if isinstance(target, ast.Tuple | ast.List):
                return [e.id if isinstance(e, ast.Name) else "" for e in target.elts]
    return []


def _unpacked_set(fn: ast.AST, name: str) -> set[str]:
    return {n for n in _unpacked(fn, name) if n}


@rule("TD803", ast.Module)
def function_called_directly(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    if not index.function_classes:
        return  # no custom Function in this file
    for call in index.nodes(ast.Call):
        _function_called_directly(call, ctx)  # type: ignore[arg-type]


def _function_called_directly(node: ast.Call, ctx: Context) -> None:
    func = node.func
    index = ctx.index
    if isinstance(func, ast.Call):  # MyFn()(x)
        name = dotted(func.func)
        info = index.classes.get(name or "")
        if info is None or not info.is_function:
            return
        ctx.report(
            node,
            variable=snippet(ctx, node, 40),
            how=f"calling an instance of `{name}` raises RuntimeError (legacy autograd function with non-static forward method)",
            cls=name,
        )
        return
    if isinstance(func, ast.Name):  # fn = MyFn(); fn(x)
        values = index.definitions(func.id, node)
        if not values or not isinstance(values[-1], ast.Call):
            return
        name = dotted(values[-1].func)
        info = index.classes.get(name or "")
        if info is None or not info.is_function or values[-1].args:
            return
        ctx.report(
            node,
            variable=snippet(ctx, node, 40),
            how=f"`{func.id}` is an instance of `{name}`, and calling it raises RuntimeError (legacy autograd function with non-static forward method)",
            cls=name,
        )
        return
    if isinstance(func, ast.Attribute) and func.attr == "forward":
        name = dotted(func.value)
        info = index.classes.get(name or "")
        if info is None or not info.is_function:
            return
        owner = index.class_of(node)
        if owner is not None and owner.is_function:
            return  # a Function delegating to another one's forward on purpose
        ctx.report(
            node,
            variable=snippet(ctx, node, 40),
            how=f"it runs forward as a plain function, so no graph node is recorded and `{name}.backward` never runs",
            cls=name,
        )


@rule("TD804", ast.Module)
def checkpoint_without_use_reentrant(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in index.calls_to(*sorted(_CHECKPOINT)):
        _checkpoint_without_use_reentrant(call, ctx)


def _checkpoint_without_use_reentrant(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    q = index.callee(node)
    if q not in _CHECKPOINT or not ctx.torch_at_least(1, 11):
        return
    if any(kw.arg in ("use_reentrant", None) for kw in node.keywords):
        return
    target = node.args[0] if node.args else None
    ctx.report(node, variable=snippet(ctx, node.func), target_expr=snippet(ctx, target, 40) if target is not None else "the function")


# -- graph cuts inside forward ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Cut:
    node: ast.Call | ast.Attribute  # the .detach() / .numpy() / .item() / .tolist() / .data
    kind: str  # "detach" | "host"
    killed: frozenset  # the parameter uses upstream of the cut
    back_to_tensor: bool = False


@dataclass(frozen=True)
class _Val:
    """What an expression in forward depends on: parameter uses reaching it with gradient, and cuts."""

    sources: frozenset = frozenset()
    cuts: frozenset = field(default_factory=frozenset)


_EMPTY = _Val()


def _join(*vals: _Val) -> _Val:
    if not vals:
        return _EMPTY
    if len(vals) == 1:
        return vals[0]
    return _Val(frozenset().union(*(v.sources for v in vals)), frozenset().union(*(v.cuts for v in vals)))


class _Forward:
    """A small flow analysis of one `forward`: which parameter uses reach the returned value."""

    def __init__(self, index: Index, fn: ast.FunctionDef | ast.AsyncFunctionDef, info: ClassInfo):
        self.index = index
        self.fn = fn
        self.info = info
        self.trainable = _trainable_attrs(index, info)
        self.env: dict[str, _Val] = {}
        self.returns: list[tuple[ast.Return, _Val]] = []
        self.reached: set[ast.AST] = set()  # trainable sources that reach any returned value, the extra ones too

    def run(self) -> None:
        self.block(self.fn.body, conditional=False, grad_off=False, guarded=False)

    def bind(self, target: ast.AST, val: _Val, conditional: bool) -> None:
        for n in subtree(target):
            if isinstance(n, ast.Name):
                self.env[n.id] = _join(self.env[n.id], val) if conditional and n.id in self.env else val

    def block(self, stmts: list[ast.stmt], conditional: bool, grad_off: bool, guarded: bool) -> None:
        for stmt in stmts:
            self.stmt(stmt, conditional, grad_off, guarded)

    def stmt(self, stmt: ast.stmt, conditional: bool, grad_off: bool, guarded: bool) -> None:
        if isinstance(stmt, ast.Assign):
            val = self.value(stmt.value, grad_off)
            for target in stmt.targets:
                self.bind(target, val, conditional)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self.bind(stmt.target, self.value(stmt.value, grad_off), conditional)
        elif isinstance(stmt, ast.AugAssign):
            val = self.value(stmt.value, grad_off)
            if isinstance(stmt.target, ast.Name):
                self.env[stmt.target.id] = _join(self.env.get(stmt.target.id, _EMPTY), val)
        elif isinstance(stmt, ast.Expr):
            call = stmt.value
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "detach_"
                and isinstance(call.func.value, ast.Name)
            ):
                self.env[call.func.value.id] = self.value(call, grad_off)
        elif isinstance(stmt, ast.If):
            self.value(stmt.test, grad_off)
            mode_test = _mentions_training(stmt.test)
            self.block(stmt.body, True, grad_off, guarded or mode_test)
            self.block(stmt.orelse, True, grad_off, guarded or mode_test)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            self.bind(stmt.target, self.value(stmt.iter, grad_off), True)
            self.block(stmt.body, True, grad_off, guarded)
            self.block(stmt.body, True, grad_off, guarded)  # a second pass: values carried round the loop
            self.block(stmt.orelse, True, grad_off, guarded)
        elif isinstance(stmt, ast.While):
            self.block(stmt.body, True, grad_off, guarded)
            self.block(stmt.body, True, grad_off, guarded)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            off = grad_off or any(_grad_off(self.index, item.context_expr) for item in stmt.items)
            for item in stmt.items:
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, self.value(item.context_expr, off), conditional)
            self.block(stmt.body, conditional, off, guarded)
        elif isinstance(stmt, ast.Try):
            self.block(stmt.body, True, grad_off, guarded)
            for handler in stmt.handlers:
                self.block(handler.body, True, grad_off, guarded)
            self.block(stmt.orelse, True, grad_off, guarded)
            self.block(stmt.finalbody, conditional, grad_off, guarded)
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            val = self.value(stmt.value, grad_off, primary=True)
            if not guarded and not grad_off:
                self.returns.append((stmt, val))
                self.reached |= self.value(stmt.value, grad_off).sources

    def value(self, expr: ast.AST | None, grad_off: bool, primary: bool = False) -> _Val:
        val = self._value(expr, primary)
        if grad_off:
            return _Val(frozenset(), frozenset())  # computed without autograd on purpose
        return val

    def _value(self, expr: ast.AST | None, primary: bool = False) -> _Val:
        if expr is None or isinstance(expr, ast.Constant):
            return _EMPTY
        if isinstance(expr, ast.Name):
            return self.env.get(expr.id, _EMPTY)
        if isinstance(expr, ast.Tuple) and primary and expr.elts:
            return self._value(expr.elts[0])  # the module's main output; the rest may be detached on purpose
        if isinstance(expr, ast.Attribute):
            if isinstance(expr.value, ast.Name) and expr.value.id == "self":
                # a parameter or a submodule's weights; buffers and plain attributes carry no gradient
                return _Val(frozenset({expr})) if expr.attr in self.trainable else _EMPTY
            if expr.attr in _NO_GRAPH_ATTRS:
                return _EMPTY
            inner = self._value(expr.value)
            if expr.attr == "data":
                return self._cut(expr, "detach", inner)
            return inner
        if isinstance(expr, ast.Call):
            return self._call(expr)
        if isinstance(expr, ast.ListComp | ast.GeneratorExp | ast.SetComp | ast.DictComp):
            saved = dict(self.env)
            for gen in expr.generators:
                self.bind(gen.target, self._value(gen.iter), False)
            parts = [expr.key, expr.value] if isinstance(expr, ast.DictComp) else [expr.elt]
            val = _join(*(self._value(p) for p in parts))
            self.env = saved
            return val
        if isinstance(expr, ast.Lambda | ast.Compare):
            return _EMPTY  # a function object; a boolean mask
        return _join(*(self._value(child) for child in ast.iter_child_nodes(expr) if isinstance(child, ast.expr)))

    def _cut(self, node: ast.Call | ast.Attribute, kind: str, operand: _Val) -> _Val:
        cuts = operand.cuts
        if kind == "host":
            # `.detach().cpu().numpy()`: the detach only silenced numpy()'s error; the host copy is the cut.
            detached = {c for c in cuts if c.kind == "detach"}
            cuts = (cuts - detached) | {_Cut(node, "host", c.killed) for c in detached}
        if not operand.sources:
            return _Val(frozenset(), frozenset(cuts))
        return _Val(frozenset(), frozenset(cuts) | {_Cut(node, kind, operand.sources)})

    def _call(self, call: ast.Call) -> _Val:
        func = call.func
        args = [*call.args, *(kw.value for kw in call.keywords)]
        if isinstance(func, ast.Attribute):
            method = func.attr
            if isinstance(func.value, ast.Name) and func.value.id == "self":
                joined = _join(*(self._value(a) for a in args))
                method_def = self.info.method(method)
                if method_def is not None and not _uses_trainable(method_def, self.trainable):
                    return joined  # a helper method that applies no parameter
                return _Val(joined.sources | {call}, joined.cuts)  # a submodule, or a method that uses one
            if method in ("detach", "detach_"):
                return self._cut(call, "detach", self._value(func.value))
            if method in ("numpy", "item", "tolist"):
                return self._cut(call, "host", self._value(func.value))
            if method in _NO_GRAPH_METHODS or method in _NON_DIFFERENTIABLE:
                return _EMPTY
            q = self.index.resolve(func)
            if q is not None and q.rsplit(".", 1)[-1] in _NON_DIFFERENTIABLE:
                return _EMPTY
            if q in _TO_TENSOR:
                return _back_to_tensor(_join(*(self._value(a) for a in args)))
            return _join(self._value(func.value), *(self._value(a) for a in args))
        q = self.index.resolve(func)
        if q in _TO_TENSOR:
            return _back_to_tensor(_join(*(self._value(a) for a in args)))
        if isinstance(func, ast.Name) and func.id in ("int", "float", "bool", "len", "str"):
            return self._cut(call, "host", _join(*(self._value(a) for a in args)))
        return _join(self._value(func), *(self._value(a) for a in args))


def _trainable_attrs(index: Index, info: ClassInfo) -> set[str]:
    """`self.x` attributes that hold parameters: nn.Parameter, a module, a container of modules, or
    registered with register_parameter / add_module. Unknown attributes (set elsewhere, inherited)
    count too; buffers and plain tensors do not."""
    trainable: set[str] = set()
    plain: set[str] = set()
    numbers, attrs = _numeric_attrs(info)
    for assign in index.self_assignments(info, None):
        value = assign.value
        q = index.resolve(value.func) if isinstance(value, ast.Call) else None
        local = dotted(value.func) if isinstance(value, ast.Call) else None
        short = (q or "").rsplit(".", 1)[-1]
        if (q and q.startswith("torch.nn.") and short[:1].isupper()) or (
            local in index.classes and index.classes[local].is_module
        ):
            trainable.add(assign.attr)
        elif isinstance(value, ast.Name | ast.Attribute) and assign.method.name == "__init__" \
                and assign.attr not in numbers:
            trainable.add(assign.attr)  # self.backbone = backbone: a module handed in
        else:
            plain.add(assign.attr)
    for call in index.method_calls("register_buffer"):
        if call.args and isinstance(call.args[0], ast.Constant) and index.class_of(call) is info:
            plain.add(str(call.args[0].value))
    for method in ("register_parameter", "add_module", "register_module"):
        for call in index.method_calls(method):
            if call.args and isinstance(call.args[0], ast.Constant) and index.class_of(call) is info:
                trainable.add(str(call.args[0].value))
    unknown = attrs - plain - trainable - _NO_GRAPH_ATTRS
    return trainable | {a for a in unknown if a not in info.methods}


def _numeric_attrs(info: ClassInfo) -> tuple[set[str], set[str]]:
    """`self.K` used as a number somewhere in the class (`self.K + 1`, `range(self.K)`): a count handed to
    `__init__`, not a module (RepDistiller's ContrastMemory draws `batchSize * (self.K + 1)` negatives). With them,
    every `self.x` the class reads or writes: one walk of the class for both (torch's module classes are long)."""
    def attr(n: ast.AST) -> str | None:
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            return n.attr
        return None

    def number(n: ast.AST) -> bool:
        return isinstance(n, ast.Constant) and type(n.value) in (int, float)

    out: set[str] = set()
    attrs: set[str] = set()
    for n in subtree(info.node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            attrs.add(n.attr)
        elif isinstance(n, ast.BinOp):
            for a, b in ((n.left, n.right), (n.right, n.left)):
                name = attr(a)
                if name is not None and number(b):
                    out.add(name)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "range":
            out.update(name for name in map(attr, n.args) if name is not None)
    return out, attrs


def _uses_trainable(fn: ast.AST, trainable: set[str]) -> bool:
    return any(
        isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" and n.attr in trainable
        for n in subtree(fn)
    )


def _grad_off(index: Index, expr: ast.AST) -> bool:
    """`torch.no_grad()`, `torch.inference_mode()`, `torch.set_grad_enabled(False)`."""
    if not isinstance(expr, ast.Call):
        return False
    q = index.resolve(expr.func)
    if q in index.names["no_grad"]:
        return not is_constant(kwarg(expr, "mode", 0), False)
    return q in index.names["set_grad_enabled"] and is_constant(kwarg(expr, "mode", 0), False)


def _back_to_tensor(val: _Val) -> _Val:
    return _Val(val.sources, frozenset(_Cut(c.node, c.kind, c.killed, True) if c.kind == "host" else c for c in val.cuts))


def _mentions_training(test: ast.AST) -> bool:
    for n in subtree(test):
        if isinstance(n, ast.Attribute) and n.attr == "training":
            return True
        if isinstance(n, ast.Call) and dotted(n.func) in ("torch.is_grad_enabled", "torch.jit.is_scripting"):
            return True
    return False


@rule("TD805", ast.Module, reads=(ast.FunctionDef,))
def graph_cut_in_forward(node: ast.Module, ctx: Context) -> None:
    # the `forward` methods, picked in one loop over the file's functions rather than by a check called on each
    for fn in ctx.index.nodes(ast.FunctionDef):
        if fn.name == "forward" and fn.body:  # type: ignore[attr-defined]
            _graph_cut_in_forward(fn, ctx)  # type: ignore[arg-type]


def _graph_cut_in_forward(node: ast.FunctionDef, ctx: Context) -> None:
    index = ctx.index
    owner = index.parent(node)
    if not isinstance(owner, ast.ClassDef):
        return
    info = index.classes.get(owner.name)
    if info is None or info.node is not owner or not info.is_module:
        return
    if index.grad_disabled(node.body[0]):
        return  # the whole forward runs without autograd: inference-only on purpose
    flow = _Forward(index, node, info)
    flow.run()
    reported: set[ast.AST] = set()
    for _, val in flow.returns:
        for cut in val.cuts:
            if cut.node in reported or cut.killed & (val.sources | flow.reached):
                # the parameters before the cut still reach the output another way, or another returned value
                # (a VQ codebook cut by the straight-through estimator trains through the returned vq_loss)
                continue
            if cut.kind == "detach" and val.sources:
                continue  # later layers still train (a frozen feature extractor, a probe): deliberate
            if cut.kind == "detach" and all(_frozen_table(index, info, k) or _plain_attribute(index, info, k)
                                            for k in cut.killed):
                continue  # a fixed lookup table (sinusoidal embedding), a constant mask: nothing to train
            if cut.kind == "host" and not cut.back_to_tensor:
                continue
            reported.add(cut.node)
            receiver = cut.node.func.value if isinstance(cut.node, ast.Call) else cut.node.value  # type: ignore[union-attr]
            method = f".{cut.node.func.attr}()" if isinstance(cut.node, ast.Call) and isinstance(cut.node.func, ast.Attribute) else (
                ".data" if isinstance(cut.node, ast.Attribute) else f"{dotted(cut.node.func)}()"  # type: ignore[union-attr]
            )
            upstream = sorted(cut.killed, key=lambda n: (n.lineno, n.col_offset))[0]
            ctx.report(
                cut.node,
                variable=snippet(ctx, receiver, 40),
                method=method,
                cls=owner.name,
                upstream=snippet(ctx, upstream, 40),
            )


def _plain_attribute(index, info, node: ast.AST) -> bool:
    """`self.weights[:n, :n].to(self.device).detach()` (textgen's SelfAttentionMask): the cut's inputs are attributes
    the class only ever sets to values that are no parameter or module (a mask from a static method, the device it
    was handed), so there is no parameter before the cut to lose its gradient."""
    while isinstance(node, ast.Subscript):
        node = node.value
    name = dotted(node) or ""
    if not (isinstance(node, ast.Attribute) and name.count(".") == 1 and name.startswith("self.")):
        return False
    sets = [a for a in index.self_assignments(info, None) if a.attr == node.attr]
    if not sets:
        return False
    for a in sets:
        for sub in subtree(a.value):
            if isinstance(sub, ast.keyword) and sub.arg == "requires_grad":
                return False
            if isinstance(sub, ast.Call):
                q = index.resolve(sub.func) or ""
                local = index.classes.get(dotted(sub.func) or "")
                if q.startswith("torch.nn.") or (local is not None and local.is_module):
                    return False  # a parameter, a layer: something trainable
    return True


def _frozen_table(index, info, node: ast.AST) -> bool:
    """`self.emb(x)` where `__init__` builds `self.emb = nn.Embedding(...)` and freezes it (`self.emb.weight =
    nn.Parameter(w, requires_grad=False)`, `...requires_grad = False`, `requires_grad_(False)`), or builds it with
    `nn.Embedding.from_pretrained(w)` (frozen by default): Informer's and PatchTST's FixedEmbedding."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and dotted(node.func.value) == "self"):
        return False
    attr = node.func.attr
    built = frozen = False
    for a in index.self_assignments(info, "__init__"):
        if a.attr != attr or not isinstance(a.value, ast.Call):
            continue
        q = index.resolve(a.value.func) or ""
        if q == "torch.nn.Embedding":
            built = True
        elif q == "torch.nn.Embedding.from_pretrained":
            built = True
            frozen = frozen or not is_constant(kwarg(a.value, "freeze", 1), False)
    init = info.method("__init__")
    if not built or init is None:
        return False
    for sub in subtree(init):
        if isinstance(sub, ast.Assign) and len(sub.targets) == 1:
            target = dotted(sub.targets[0]) or ""
            if target == f"self.{attr}.weight" and isinstance(sub.value, ast.Call) and \
                    is_constant(kwarg(sub.value, "requires_grad", 1), False):
                frozen = True
            if target == f"self.{attr}.weight.requires_grad" and is_constant(sub.value, False):
                frozen = True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "requires_grad_" \
                and dotted(sub.func.value) in (f"self.{attr}", f"self.{attr}.weight") \
                and is_constant(kwarg(sub, "requires_grad", 0), False):
            frozen = True
    return frozen


# -- TD806 -------------------------------------------------------------------------------------


def _all_none(expr: ast.AST | None) -> bool:
    if expr is None or is_constant(expr, None):
        return True
    if isinstance(expr, ast.Tuple | ast.List):
        return all(_all_none(e) for e in expr.elts)
    return False


@rule("TD806", ast.ClassDef)
def backward_ignores_grad_output(node: ast.ClassDef, ctx: Context) -> None:
    info = _function_class(ctx, node)
    if info is None:
        return
    backward = info.method("backward")
    if backward is None or backward.args.vararg is not None or backward.args.kwarg is not None:
        return
    grads = [a.arg for a in _positional(backward)[1:]]  # after ctx
    if not grads:
        return
    read = {n.id for n in subtree(backward) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if read & set(grads):
        return  # the incoming gradient reaches the result (or at least is read)
    if any(not _all_none(r.value) for r in _returns(backward)):
        ctx.report(backward, variable=node.name, grads=", ".join(grads))  # the signature names what is dropped


# -- a generator's loss computed on its detached output ------------------------------------------

# A loss named for the generator: `g_loss`, `G_loss1`, `loss_G`, `errG`, `gen_loss`, `generator_adv_loss`.
_GENERATOR_NAME = re.compile(r"(?:^|_)(?:g|gen|generator)(?:_|\d|$)|^errg|loss_?g(?:en)?(?:\d|_|$)", re.I)
_LOSS_WORD = re.compile(r"loss|err|adv|cost", re.I)
# ... and not the discriminator's (`losses_disc_f_g`: the discriminator's loss on the generated samples).
_DISCRIMINATOR_NAME = re.compile(r"disc|critic|(?:^|_)d(?:_|\d|$)|^errd|loss_?d(?:\d|_|$)", re.I)


def _generator_loss_name(name: str | None) -> bool:
    return bool(name) and bool(_GENERATOR_NAME.search(name)) and bool(_LOSS_WORD.search(name)) \
        and not _DISCRIMINATOR_NAME.search(name)  # type: ignore[arg-type]


def _detached_operand(node: ast.AST) -> ast.AST | None:
    """`fake.detach()` / `fake.data`: the tensor cut from its graph, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach" \
            and not node.args and not node.keywords:
        return node.func.value
    if isinstance(node, ast.Attribute) and node.attr == "data" and isinstance(node.ctx, ast.Load):
        return node.value
    return None


@rule("TD807", ast.Module, reads=(ast.AugAssign,))
def generator_loss_on_detached_output(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    # The finding names the generator's loss, a name some assignment (or `+=`) of the file binds: a file that binds
    # no such name (nearly every file) skips reading every call's arguments for a detached operand.
    targets = [*index.assigned_values(), *(dotted(s.target) for s in index.nodes(ast.AugAssign))]  # type: ignore[attr-defined]
    if not any(_generator_loss_name(name) for name in targets):
        return
    for call in index.nodes(ast.Call):
        if not isinstance(call.func, ast.Name | ast.Attribute):  # type: ignore[attr-defined]
            continue
        scored = _detached_operand(call)
        if isinstance(scored, ast.Call) and isinstance(scored.func, ast.Name | ast.Attribute):
            # `pred_fake = netd(fake).detach()`: the score itself cut from the graph
            fake = next((a for a in scored.args if isinstance(a, ast.Name)), None)
            if fake is not None and _generator_loss_on_detached(scored, call, fake, ctx):
                continue
        for arg in call.args:  # type: ignore[attr-defined]
            fake = _detached_operand(arg)
            if fake is not None and _generator_loss_on_detached(call, arg, fake, ctx):  # type: ignore[arg-type]
                break


def _generator_loss_on_detached(call: ast.Call, arg: ast.AST, fake: ast.AST, ctx: Context) -> bool:
    """`d_fake = self.d(fake.detach())` then `G_loss = mse(d_fake, ones)`: the discriminator scores a copy of the
    generator's output cut from its graph, and that score is the generator's loss: it reaches D's weights only."""
    index = ctx.index
    if not isinstance(fake, ast.Name | ast.Attribute) or not index.is_submodule(call.func):
        return False
    made = latest_model_output(index, fake)
    if made is None or dotted(made.func) == dotted(call.func):
        return False  # not another model's output (or the same model's: a target network, an EMA teacher)
    fn = index.function_of(call)
    stmt = index.statement_of(call)
    if fn is None or stmt is None:
        return False
    loss = _tainted_generator_loss(index, fn, stmt)
    if loss is None:
        return False
    ctx.report(arg, variable=ctx.segment(arg, 40), generator=ctx.segment(made.func, 30),
               scorer=ctx.segment(call.func, 30), loss=loss)
    return True


def latest_model_output(index: Index, name: ast.Name | ast.Attribute) -> ast.Call | None:
    """The model call that last assigned `name` in its function (`fake = self.g(z)`, or skip-ganomaly's
    `self.fake = self.netg(self.input + self.noise)` a few lines above `self.netd(self.fake.detach())`), if that
    is what it holds."""
    if isinstance(name, ast.Attribute):
        if not (isinstance(name.value, ast.Name) and name.value.id == "self"):
            return None
        value = latest_self_value(index, name, name)
    else:
        values = index.definitions(name.id, name)
        value = values[-1] if values else None
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in ("view", "reshape", "squeeze", "unsqueeze", "float", "to", "contiguous"):
        value = value.func.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name | ast.Attribute) and index.is_submodule(value.func):
        return value
    return None


def _tainted_generator_loss(index: Index, fn: ast.AST, start: ast.stmt) -> str | None:
    """Follow the value of `start` forward through the function's assignments (in source order, a name rebound
    from something else drops out): the first name it flows into that names the generator's loss."""
    tainted: set[str] = set()
    here = (start.lineno, start.col_offset)
    statements = sorted(
        (s for s in subtree(fn) if isinstance(s, ast.Assign | ast.AugAssign | ast.AnnAssign) and s.value is not None
         and (s.lineno, s.col_offset) >= here),
        key=lambda s: (s.lineno, s.col_offset),
    )
    for stmt in statements:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = [dotted(t) for t in targets for t in (t.elts if isinstance(t, ast.Tuple) else [t])]
        if stmt is start:
            reads = True
        else:
            reads = any(isinstance(n, ast.Name | ast.Attribute) and dotted(n) in tainted
                        for n in subtree(stmt.value))  # type: ignore[arg-type]
        for name in names:
            if name is None:
                continue
            if reads:
                if _generator_loss_name(name):
                    return name
                tainted.add(name)
            elif not isinstance(stmt, ast.AugAssign):
                tainted.discard(name)
    return None


# Objects whose `.backward(loss)` runs the loss's backward (Accelerate, Fabric, DeepSpeed engines).
_BACKWARD_RUNNERS = frozenset({"accelerator", "fabric", "engine", "model_engine", "manual_backward"})
# How a term is cut from the graph: the methods and attributes whose result holds no autograd history.
_CUTS = frozenset({"detach", "item", "data", "tolist", "numpy"})


def _cut_value(expr: ast.AST) -> tuple[ast.AST, str] | None:
    """(the value cut, how) for `x.detach()`, `x.item()`, `x.detach().item()`, `x.data`, `float(x)`."""
    if isinstance(expr, ast.Call) and not expr.args and isinstance(expr.func, ast.Attribute) \
            and expr.func.attr in _CUTS:
        inner = _cut_value(expr.func.value)
        return inner if inner is not None else (expr.func.value, f".{expr.func.attr}()")
    if isinstance(expr, ast.Attribute) and expr.attr == "data":
        return expr.value, ".data"
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "float" \
            and len(expr.args) == 1:
        return expr.args[0], "float()"
    return None


def _constant_factor(index: Index, expr: ast.AST) -> bool:
    """A weight that carries no gradient of its own: a number, a config attribute (`opt.beta3`), a bare name
    the function never computes (a hyper-parameter)."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, int | float) or isinstance(expr, ast.Attribute):
        return True
    if isinstance(expr, ast.UnaryOp):
        return _constant_factor(index, expr.operand)
    return isinstance(expr, ast.Name) and not index.definitions(expr.id, expr)


def _additive_terms(index: Index, expr: ast.AST, depth: int = 0) -> list[ast.AST]:
    """The terms a loss is the sum of, through the function's names: `at_loss = at1 + at2 + cls_loss` with
    `at1 = criterion(a, b).detach() * beta` gives `criterion(a, b).detach() * beta` among them."""
    if depth > 6:
        return []
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add | ast.Sub):  # type: ignore[attr-defined]
        return _additive_terms(index, expr.left, depth + 1) + _additive_terms(index, expr.right, depth + 1)
    if isinstance(expr, ast.Name):
        values = index.definitions(expr.id, expr)
        if len(values) == 1 or values and isinstance(values[-1], ast.BinOp):
            # `loss = loss + term` rebinds: its earlier value is one more term
            return _additive_terms(index, values[-1], depth + 1) or [expr]
    return [expr]


def _scaled_cut(index: Index, term: ast.AST) -> tuple[ast.AST, ast.AST, str] | None:
    """(the cut expression, the value cut, how) when a term is a cut value, maybe times or over a constant weight."""
    while isinstance(term, ast.BinOp) and isinstance(term.op, ast.Mult | ast.Div):  # type: ignore[attr-defined]
        if _constant_factor(index, term.right):
            term = term.left
        elif isinstance(term.op, ast.Mult) and _constant_factor(index, term.left):
            term = term.right
        else:
            return None
    cut = _cut_value(term)
    return (term, *cut) if cut is not None else None


@rule("TD808", ast.Module)
def loss_term_detached(node: ast.Module, ctx: Context) -> None:
    """`at3_loss = criterionAT(a_s, a_t).detach() * beta`, then `(at3_loss + cls_loss).backward()`: the term counts
    in the loss value and trains nothing."""
    index = ctx.index
    _leave_functions_returning_cut_values(ctx)
    backpropagated = _backpropagated(index)
    for call in index.backward_calls:
        target = _backward_target(call)
        if target is None:
            continue
        terms = _additive_terms(index, target)
        if len(terms) < 2:
            continue  # the whole loss detached is another failure (backward raises): not this rule's
        texts = {ast.unparse(t) for t in terms}
        for term in terms:
            found = _scaled_cut(index, term) or _cut_on_every_path(index, term)
            if found is None:
                _leave_term_from_another_file(ctx, term, target)
                continue
            cut, value, how = found
            if not isinstance(value, ast.Call | ast.Name | ast.Attribute) or ast.unparse(value) in texts:
                continue  # `x - x.detach()`: the value and its gradient on purpose
            if isinstance(value, ast.Name | ast.Attribute) and (dotted(value) or "") in backpropagated:
                continue  # the term has its own backward: detached here so it is not counted twice
            if isinstance(value, ast.Name) and not _computed_here(index, value):
                continue  # a parameter of the function: what it holds is the caller's
            ctx.report(cut, variable=ctx.segment(value, 40), op=how, loss=ctx.segment(target, 40),
                       detached_from=ctx.segment(value, 40))


def _cut_on_every_path(index: Index, term: ast.AST) -> tuple[ast.AST, ast.AST, str] | None:
    """(the cut, the value cut, how) when the cut is not on the term itself but on every path of it to a model:
    `rec = F.mse_loss(decoder(z).detach(), x)`, `out.data.abs().mean()`, a student's forward run under `no_grad`,
    `torch.tensor([w.norm().item() ...])` (semantic/graphreach.py)."""
    found = graphreach.reach(index, term)
    if found.state != graphreach.CUT or found.cut is None:
        return None
    cut = found.cut
    if isinstance(cut, ast.Call) and isinstance(cut.func, ast.Attribute) and found.how.startswith("."):
        value: ast.AST = cut.func.value
    elif isinstance(cut, ast.Attribute):
        value = cut.value
    elif isinstance(cut, ast.Call) and isinstance(cut.func, ast.Name) and cut.args:
        value = cut.args[0]  # `float(x)`
    elif isinstance(cut, ast.Assign | ast.AnnAssign) and cut.value is not None:
        value = cut.value  # computed under `no_grad`: the model call the block holds
    else:
        value = cut
    how = found.how if getattr(cut, "lineno", 0) == getattr(term, "lineno", 0) else f"{found.how} (line {cut.lineno})"
    return cut, value, how


def _leave_functions_returning_cut_values(ctx: Context) -> None:
    """For the project pass: a module-level function every `return` of which is cut from the graph
    (`return (pred[:, 1:] - pred[:, :-1]).pow(2).mean().item()`): a loss term another file builds from its value
    trains nothing."""
    index = ctx.index
    cutting = {index.function_of(c) for m in ("item", "detach", "tolist", "numpy") for c in index.method_calls(m)}
    for fn in cutting:
        if not isinstance(fn, ast.FunctionDef) or not isinstance(index.parent(fn), ast.Module):
            continue
        returns = index.returns_of(fn)
        reached = [graphreach.reach(index, r) for r in returns]
        if reached and all(r.state == graphreach.CUT for r in reached):
            ctx.leave("returns-cut", {"function": fn.name, "how": reached[0].how})


def _leave_term_from_another_file(ctx: Context, term: ast.AST, loss: ast.AST) -> None:
    """For the project pass: a loss term that is the value of another file's function (`weight * smoothness(pred)`),
    which this file cannot read."""
    index = ctx.index
    while isinstance(term, ast.BinOp) and isinstance(term.op, ast.Mult | ast.Div):
        if graphreach.is_weight(index, term.right):
            term = term.left
        elif isinstance(term.op, ast.Mult) and graphreach.is_weight(index, term.left):
            term = term.right
        else:
            return
    if isinstance(term, ast.Name):
        values = index.definitions(term.id, term)
        term = values[-1] if len(values) == 1 else term
    if not isinstance(term, ast.Call) or not isinstance(term.func, ast.Name | ast.Attribute) \
            or index.local_target(term) is not None:
        return
    q = index.resolve(term.func)
    if q is None or "." not in q or q.split(".", 1)[0] in ("torch", "numpy", "math", "torchvision"):
        return
    ctx.leave("loss-term-call", {"callee": q, "line": term.lineno, "col": term.col_offset + 1,
                                 "variable": ctx.segment(term, 40), "loss": ctx.segment(loss, 40)})


@project("TD808")
def loss_term_from_a_cutting_function(project: Project) -> list[ProjectHit]:
    """engine.py adds `weight * smoothness(pred)` to its loss; losses.py's `smoothness` returns `.item()` of its
    value: the term is a number and trains nothing."""
    cutting = {(f.module, fact["function"]): fact["how"] for f, fact in project.facts("returns-cut")}
    if not cutting:
        return []
    hits = []
    for f, fact in project.facts("loss-term-call"):
        for owner, name in project.defining(fact["callee"]):
            how = cutting.get((owner.module, name))
            if how is not None:
                hits.append(ProjectHit(f.path, fact["line"], fact["col"], {
                    "variable": fact["variable"], "loss": fact["loss"], "detached_from": fact["variable"],
                    "op": f"`{name}()`, which returns its value through `{how}` ({owner.path})"}))
                break
    return hits


def _backward_target(call: ast.Call) -> ast.AST | None:
    """What backward runs on: `loss.backward()`, `scaler.scale(loss).backward()`, `accelerator.backward(loss)`."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "backward"):
        return None
    receiver = call.func.value
    if call.args and (dotted(receiver) or "").rsplit(".", 1)[-1] in _BACKWARD_RUNNERS:
        return call.args[0]  # `accelerator.backward(loss)`, `model_engine.backward(loss)`
    if isinstance(receiver, ast.Name | ast.Attribute | ast.BinOp):
        return receiver
    if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) \
            and receiver.func.attr == "scale" and receiver.args:
        return receiver.args[0]  # `scaler.scale(loss).backward()`
    return None


def _backpropagated(index: Index) -> set[str]:
    out: set[str] = set()
    for call in index.backward_calls:
        target = _backward_target(call)
        if target is not None:
            out.update(d for n in subtree(target) if (d := dotted(n)))
    return out


def _computed_here(index: Index, name: ast.Name) -> bool:
    values = index.definitions(name.id, name)
    return bool(values) and isinstance(values[-1], ast.Call | ast.BinOp | ast.Subscript)

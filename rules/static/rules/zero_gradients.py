"""TD612: a square root of a value that reaches exactly 0, with nothing added under the root.

d sqrt(x)/dx = 1 / (2 sqrt(x)) is infinite at x = 0. Four values this code computes reach 0 exactly: a sum of
squares (a length, 0 whenever the vector is: a flat image's gradient map, two coinciding points, an all-zero
capsule), a variance (0 for a constant row or channel), a value clamped at 0 (`d.clamp(min=0)`: the clamp says it
gets there, and at exactly 0 torch's clamp passes the gradient through), and `1 - cos**2` (0 where a feature lines
up with its class weight). Backward then multiplies that inf by the 0 of the inner derivative and every weight
upstream gets NaN. torch.linalg.vector_norm, torch.norm and torch.std define a 0 subgradient there, and F.relu
masks its own, so those spellings are not claimed; an epsilon added after the root changes neither.
"""

from __future__ import annotations

import ast
import os

from torchdoctor.rules.static.api import Context, rule
from torchdoctor.rules.static.index import Index, dotted, is_constant, kwarg
from torchdoctor.rules.static.rules.debugging import _in_loss_code
from torchdoctor.rules.static.rules.profiling import snippet

_REDUCTIONS = frozenset({"torch.sum", "torch.mean"})


@rule("TD612", ast.Call, ast.Module, reads=(ast.BinOp,), callees=("torch.sqrt", "torch.pow", "torch.rsqrt"),
      methods=("sqrt", "pow", "rsqrt"))
def sqrt_of_sum_of_squares(node: ast.Call | ast.Module, ctx: Context) -> None:
    if isinstance(node, ast.Module):
        # `x ** 0.5` after the calls, as the engine handed BinOps after them: one loop over the file's arithmetic
        # with `_radicand`'s test of the right operand inline, not a check called on every `+` and `*`
        for binop in ctx.index.nodes(ast.BinOp):
            if _is_half(binop.right):  # type: ignore[attr-defined]
                _sqrt_of_sum_of_squares(binop, ctx)
        return
    _sqrt_of_sum_of_squares(node, ctx)


def _sqrt_of_sum_of_squares(node: ast.Call | ast.BinOp, ctx: Context) -> None:
    index = ctx.index
    inner = _radicand(index, node)
    if inner is None:
        return
    reaches = _reaches_zero(index, inner, node, 0)
    if reaches is None or not _differentiated_here(index, ctx, node):
        return
    if _read_on_host_only(index, node):
        return
    # One finding per function: its roots share one cause and one fix (nodes arrive in source order).
    reported: set[ast.AST | None] = ctx.memo("TD612-functions", set)
    fn = index.function_of(node)
    if fn in reported:
        return
    reported.add(fn)
    after = " (the epsilon added after the root keeps the value off 0, not the gradient)" \
        if _epsilon_after(index, node) else ""
    ctx.report(node, variable=snippet(ctx, node, 60), radicand=reaches, after=after)


def _radicand(index: Index, node: ast.AST) -> ast.expr | None:
    """What is under the square root: `torch.sqrt(x)`, `x.sqrt()`, `torch.pow(x, 0.5)`, `x.pow(0.5)`, `x ** 0.5`,
    and the reciprocal root `torch.rsqrt(x)` / `x.rsqrt()` (infinite at 0 forward as well)."""
    if isinstance(node, ast.BinOp):
        return node.left if _is_half(node.right) else None
    if not isinstance(node, ast.Call):
        return None
    q = index.resolve(node.func)
    if q in ("torch.sqrt", "torch.rsqrt"):
        return kwarg(node, "input", 0)
    if q == "torch.pow":
        exponent = kwarg(node, "exponent", 1)
        return kwarg(node, "input", 0) if exponent is not None and _is_half(exponent) else None
    func = node.func
    if q is not None or not isinstance(func, ast.Attribute) or node.keywords:
        return None
    if func.attr in ("sqrt", "rsqrt") and not node.args:
        return func.value
    if func.attr == "pow" and len(node.args) == 1 and _is_half(node.args[0]):
        return func.value
    return None


def _is_half(expr: ast.AST) -> bool:
    return is_constant(expr, 0.5)


def _is_two(expr: ast.AST | None) -> bool:
    return is_constant(expr, 2) or is_constant(expr, 2.0)


def _differentiated_here(index: Index, ctx: Context, node: ast.AST) -> bool:
    """Where a gradient flows through the root: loss code (a function, class or file named for a loss), a
    method of an nn.Module subclass other than `__init__`, or a helper that such code of this file calls, and not
    under no_grad. A metric or a plot helper computes the same length with no backward through it."""
    if index.grad_disabled(node):
        return False
    fn = index.function_of(node)
    if fn is not None and fn.name == "__init__":
        return False
    if _differentiating(index, node) or "loss" in os.path.basename(ctx.path).lower():
        return True
    # A helper (`pair_distance`, a trainer's `variance_term`) is differentiated where its caller is: one level of
    # this file's calls, so a helper only ever called for a metric or under no_grad stays quiet.
    return fn is not None and any(not index.grad_disabled(call) and _differentiating(index, call)
                                  for call in index.callers(fn))


def _differentiating(index: Index, node: ast.AST) -> bool:
    """`node` sits in loss code, in a method of an nn.Module subclass, or in a function that runs backward itself
    (a training step: what it computes before `loss.backward()` is what backward runs through)."""
    if _in_loss_code(index, node):
        return True
    info = index.class_of(node)
    if info is not None and info.is_module:
        return True
    fn = index.function_of(node)  # None: a script's top level, which runs backward itself or not
    return any(index.function_of(call) is fn for call in index.backward_calls)


# What each value under the root is, for the message: why it reaches exactly 0.
_SUM_OF_SQUARES = "a sum of squares, 0 wherever the vector is all zeros"
_VARIANCE = "a variance, 0 wherever the values are all equal (a constant row, channel or padding)"
_CLAMPED = "a value clamped at 0, which the clamp says it reaches (and at exactly 0 the clamp passes the gradient on)"
_COSINE_COMPLEMENT = "1 - cos**2, 0 wherever a vector lines up with another (the cosine is exactly 1)"


def _reaches_zero(index: Index, expr: ast.AST, at: ast.AST, depth: int) -> str | None:
    """Why the value under the root can be exactly 0 (one of the texts above), or None when nothing says it can:
    followed through the function's own names; anything added under the root keeps it off 0."""
    if depth > 4:
        return None
    if isinstance(expr, ast.Name):
        values = index.definitions(expr.id, at)
        return _reaches_zero(index, values[-1], values[-1], depth + 1) if values else None
    if _sum_of_squares(index, expr, at, depth):
        return _SUM_OF_SQUARES
    if _variance(index, expr):
        return _VARIANCE
    clamped = _clamped_at_zero(index, expr)
    if clamped is not None:
        return _CLAMPED if not _kept_off_zero(clamped) and _computed_base(index, clamped, expr) \
            and not _data_only(clamped) else None
    return _COSINE_COMPLEMENT if _cosine_complement(index, expr, at) else None


def _variance(index: Index, expr: ast.AST) -> bool:
    """`torch.var(x, ...)` or `x.var(...)` of a tensor the code computes or is handed: NaN backward through its
    root for a constant input (torch.std itself defines that gradient as 0). The variance of an attribute (a
    running statistic) or of targets carries no gradient."""
    if not isinstance(expr, ast.Call):
        return False
    q = index.resolve(expr.func)
    if q == "torch.var":
        base = kwarg(expr, "input", 0)
    elif _method(q, expr, ("var",)):
        base = expr.func.value
    else:
        return False
    return isinstance(base, ast.Name | ast.Call | ast.BinOp | ast.Subscript) and not _data_only(base)


def _clamped_at_zero(index: Index, expr: ast.AST) -> ast.expr | None:
    """The value of `torch.clamp(x, min=0)`, `x.clamp(0, 1)`, `x.clamp(min=0.0)`, `x.clamp_min(0)`: clamped at
    exactly 0 from below. A clamp at a positive minimum keeps it off 0; F.relu masks the gradient at 0 itself."""
    if not isinstance(expr, ast.Call):
        return None
    q = index.resolve(expr.func)
    if q in ("torch.clamp", "torch.clip", "torch.clamp_min"):
        value, low = kwarg(expr, "input", 0), kwarg(expr, "min", 1)
    elif _method(q, expr, ("clamp", "clip", "clamp_min")):
        value, low = expr.func.value, kwarg(expr, "min", 0)
    else:
        return None
    return value if is_constant(low, 0) or is_constant(low, 0.0) else None


def _method(q: str | None, call: ast.Call, names: tuple[str, ...]) -> bool:
    """`x.<name>(...)` called on a tensor: not resolved to a function of torch's own namespace. (The index reads a
    receiver named `dist` as torch.distributed, so `dist.clamp(min=0)` resolves to `torch.distributed.clamp`.)"""
    return isinstance(call.func, ast.Attribute) and call.func.attr in names and (
        q is None or q.rsplit(".", 1)[0] != "torch")


def _kept_off_zero(expr: ast.AST) -> bool:
    """`x + eps`, `x + 1e-12`: something added that keeps the value positive."""
    return isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) and any(
        isinstance(side, ast.Constant) or "eps" in (dotted(side) or "").lower() for side in (expr.left, expr.right))


def _cosine_complement(index: Index, expr: ast.AST, at: ast.AST) -> bool:
    """`1 - cos ** 2`, `1.0 - torch.pow(cosine, 2)`, `1 - cos_theta_2` with `cos_theta_2 = cos_theta ** 2`: a
    sine made from a cosine (ArcFace-style margins). Only a base named for a cosine: `1 - alpha ** 2` in a noise
    schedule is a different, data-only quantity."""
    if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Sub)
            and (is_constant(expr.left, 1) or is_constant(expr.left, 1.0))):
        return False
    square = expr.right
    if isinstance(square, ast.Name):
        values = index.definitions(square.id, at)
        square = values[-1] if values else square
    if not _square(index, square):
        return False
    name = dotted(_square_base(index, square)) or ""
    return "cos" in name.rsplit(".", 1)[-1].lower()


def _epsilon_after(index: Index, node: ast.AST) -> bool:
    """The root is added to an epsilon (`torch.sqrt(v) + 1e-8`): the author saw the 0 and guarded the wrong side."""
    parent = index.parent(node)
    return isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add) and _kept_off_zero(parent)


def _square(index: Index, expr: ast.AST) -> bool:
    """`x ** 2`, `torch.pow(x, 2)`, `x.pow(2)`, `torch.square(x)`, `x.square()`, `x * x`."""
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.Pow):
            return _is_two(expr.right)
        return isinstance(expr.op, ast.Mult) and ast.dump(expr.left) == ast.dump(expr.right)
    if not isinstance(expr, ast.Call):
        return False
    q = index.resolve(expr.func)
    if q == "torch.pow":
        return _is_two(kwarg(expr, "exponent", 1))
    if q == "torch.square":
        return True
    if q == "torch.mul" and len(expr.args) == 2:  # `torch.mul(x, x)`
        return ast.dump(expr.args[0]) == ast.dump(expr.args[1])
    func = expr.func
    if q is None and isinstance(func, ast.Attribute):
        if func.attr == "pow" and len(expr.args) == 1:
            return _is_two(expr.args[0])
        if func.attr == "mul" and len(expr.args) == 1:  # `x.mul(x)`
            return ast.dump(func.value) == ast.dump(expr.args[0])
        return func.attr == "square" and not expr.args
    return False


def _sum_of_squares(index: Index, expr: ast.AST, at: ast.AST, depth: int) -> bool:
    """A value that is exactly 0 when the vector is: a sum or mean of squares, or squares added together,
    followed through the function's own names (`squared_norm = (x ** 2).sum(-1)` then `torch.sqrt(squared_norm)`).
    Anything else on the way (`+ eps`, a clamp, a constant) keeps it off 0 or is not the shape: no claim."""
    if depth > 4:
        return False
    if isinstance(expr, ast.Name):
        values = index.definitions(expr.id, at)
        # each value is read where it was made: `x = torch.mul(x, x); x = torch.sum(x, 1); x = torch.sqrt(x)` rebinds
        # one name three times, and the `x` under the sum is the product two statements up
        return bool(values) and all(_sum_of_squares(index, v, v, depth + 1) for v in values[-1:])
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        # Squares added by hand: every base must be a tensor this code computes. `(pred - target) ** 2 + c ** 2`
        # (pseudo-Huber) and `sigma ** 2 + self.sigma_data ** 2` (diffusion preconditioning) add a positive
        # constant's square, which keeps the sum off 0.
        return all((_square(index, side) and _computed_base(index, _square_base(index, side), at))
                   or _sum_of_squares(index, side, at, depth + 1) for side in (expr.left, expr.right))
    if not isinstance(expr, ast.Call):
        return False
    q = index.resolve(expr.func)
    if q in _REDUCTIONS:
        arg = kwarg(expr, "input", 0)
    elif q is None and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("sum", "mean"):
        arg = expr.func.value
    else:
        return False
    if isinstance(arg, ast.Name):  # `squared = torch.mul(x, x)` then `torch.sum(squared, dim=1)`
        values = index.definitions(arg.id, expr)
        arg = values[-1] if values else arg
    # The length of a ground-truth tensor (`torch.sum(flow_gt ** 2, dim=1).sqrt()` for a validity mask) has no
    # gradient to spoil.
    return arg is not None and _square(index, arg) and not _data_only(_square_base(index, arg))


def _square_base(index: Index, expr: ast.AST) -> ast.AST:
    """x in `x ** 2`, `torch.pow(x, 2)`, `x.pow(2)`, `torch.square(x)`, `x.square()`, `x * x`."""
    if isinstance(expr, ast.BinOp):
        return expr.left
    if isinstance(expr, ast.Call):
        if index.resolve(expr.func) in ("torch.pow", "torch.square", "torch.mul"):
            return kwarg(expr, "input", 0) or expr
        if isinstance(expr.func, ast.Attribute):
            return expr.func.value
    return expr


def _computed_base(index: Index, base: ast.AST, at: ast.AST) -> bool:
    """A tensor this code computes: a difference, a call, a slice, or a local name bound to one that is not
    arithmetic on sizes and constants (`c = 0.00054 * math.sqrt(math.prod(pred.shape[1:]))`). Attributes
    (`self.sigma_data`, `args.huber_c`) and parameters are hyperparameters as often as tensors: not counted."""
    if isinstance(base, ast.BinOp | ast.Call | ast.Subscript):
        return not _constant_like(index, base)
    if isinstance(base, ast.Name):
        values = index.definitions(base.id, at)
        if not values:
            return False  # a parameter or a global
        value = values[-1]
        func = value.func if isinstance(value, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr in _RESHAPES and index.resolve(func) is None:
            return _computed_base(index, func.value, value)  # `huber_c = huber_c.view(-1, 1, 1, 1)`: still the parameter
        return isinstance(value, ast.BinOp | ast.Call | ast.Subscript) and not _constant_like(index, value)
    return False


_RESHAPES = frozenset({"view", "reshape", "to", "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "float",
                       "double", "half", "type", "type_as", "contiguous"})


def _constant_like(index: Index, expr: ast.AST) -> bool:
    """Arithmetic on numbers, sizes and math/NumPy calls, with no torch call in it."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            q = index.resolve(node.func) or ""
            if q.startswith("torch."):
                return False
            if not q.startswith(("math.", "numpy.", "np.")) and q not in ("len", "float", "int", "min", "max"):
                return False
        elif isinstance(node, ast.Subscript) and not (isinstance(node.value, ast.Attribute)
                                                      and node.value.attr == "shape"):
            return False
        elif isinstance(node, ast.Name) and not isinstance(index.parent(node), ast.Attribute | ast.Call):
            return False
    return True


_DATA_WORDS = frozenset({"gt", "target", "targets", "label", "labels", "true", "truth"})


def _data_only(base: ast.AST) -> bool:
    names = [n.id for n in ast.walk(base) if isinstance(n, ast.Name)]
    return bool(names) and all(set(name.lower().split("_")) & _DATA_WORDS for name in names)


_HOST_READS = frozenset({"item", "tolist", "numpy", "cpu"})


def _read_on_host_only(index: Index, node: ast.AST) -> bool:
    """The root is bound to a name that is only compared or read to the host afterwards (an end-point error
    logged as a metric, a convergence test): backward never passes through it."""
    stmt = index.statement_of(node)
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return False
    name = stmt.targets[0].id
    scope = index.function_of(node) or index.tree
    uses = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
            and n.lineno > stmt.end_lineno]  # type: ignore[operator]
    for use in uses:
        if not _host_read_or_rebinding(index, use, name):
            return False
    return bool(uses)


def _host_read_or_rebinding(index: Index, use: ast.Name, name: str) -> bool:
    for parent in index.ancestors(use):
        if isinstance(parent, ast.Compare):
            return True
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr in _HOST_READS:
            return True
        if isinstance(parent, ast.stmt):
            return isinstance(parent, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                          for t in parent.targets)
    return False

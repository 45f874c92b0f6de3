"""TD613: log(sum(exp(x))) written out instead of torch.logsumexp.

exp overflows float32 to inf past x = 88.7 (float16 past 11.1) and underflows to 0 below about -103, so a
log-sum-exp written in three steps returns inf or -inf for inputs torch.logsumexp handles exactly, and the
backward through it gives NaN. Subtracting each row's maximum first is the stable hand-written form; subtracting
one maximum of the whole tensor is not, because rows far below that maximum still underflow to log(0).
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.api import Context, rule
from torchdoctor.rules.static.index import Index, kwarg
from torchdoctor.rules.static.rules.profiling import snippet

_REDUCTIONS = frozenset({"torch.sum", "torch.mean"})
_MAX_FUNCTIONS = frozenset({"torch.max", "torch.amax"})
_MAX_METHODS = frozenset({"max", "amax"})
_DEPTH = 2  # names followed back through the function's own assignments

_UNSHIFTED = (
    "a log of a sum of exponentials written out: exp overflows to inf past 88 in float32 (11 in float16) and "
    "underflows to 0 for large negative inputs, so the result is inf or -inf where torch.logsumexp is exact, "
    "and the gradient through it NaN"
)
_GLOBAL_SHIFT = (
    "a log of a sum of exponentials shifted by one maximum of the whole tensor: rows far below that maximum "
    "still underflow to exp(...) = 0 and give log(0) = -inf; only a maximum per reduced row keeps every row finite"
)


# Only `torch.log(...)` and `<expr>.log()` can start one (`_elementwise_operand`): the engine hands the check those calls.
@rule("TD613", ast.Call, callees=("torch.log",), methods=("log",))
def log_sum_exp_by_hand(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    inner = _elementwise_operand(index, node, "log")
    if inner is None:
        return
    exponents = _exponentials(index, inner, node, 0)
    if not exponents:
        return
    shifts = [_shift(index, x, node) for x in exponents]
    if any(s in ("row", "other") for s in shifts):
        return  # stabilised by hand, or shifted by something we cannot read
    if "global" in shifts and _reduces_everything(index, inner, node):
        return  # a sum over the whole tensor: its one maximum is the right one (ffjord's logsumexp(dim=None))
    # One finding per function: its log-sum-exps share one cause and one fix (nodes arrive in source order).
    reported: set[ast.AST | None] = ctx.memo("TD613-functions", set)
    fn = index.function_of(node)
    if fn in reported:
        return
    reported.add(fn)
    ctx.report(node, variable=snippet(ctx, node, 60), effect=_GLOBAL_SHIFT if "global" in shifts else _UNSHIFTED)


def _elementwise_operand(index: Index, node: ast.Call, op: str) -> ast.expr | None:
    """What `torch.<op>(a)` or `a.<op>()` is taken of (`op` is `log` or `exp`); None for any other call."""
    q = index.resolve(node.func)
    if q == f"torch.{op}":
        return kwarg(node, "input", 0)
    func = node.func
    if q is None and isinstance(func, ast.Attribute) and func.attr == op and not node.args and not node.keywords:
        return func.value
    return None


def _follow(index: Index, expr: ast.expr, at: ast.AST) -> ast.expr:
    """A plain name's latest value assigned before `at` in the same function, else the name itself."""
    if isinstance(expr, ast.Name):
        values = index.definitions(expr.id, at)
        if values:
            return values[-1]
    return expr


def _exponentials(index: Index, expr: ast.expr, at: ast.AST, depth: int) -> list[ast.expr]:
    """The exponents of a sum of exponentials: `torch.sum(torch.exp(x), d)`, `x.exp().sum(d)`, `torch.exp(a) +
    torch.exp(b)`, also with the exponentials masked (`torch.exp(x) * mask`) or bound to names first."""
    if depth < _DEPTH and isinstance(expr, ast.Name):
        value = _follow(index, expr, at)
        return [] if value is expr else _exponentials(index, value, value, depth + 1)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _added_exponentials(index, _added_terms(expr), at, depth)
    summed = _reduced(index, expr)
    if summed is None:
        return []
    x = _exponent(index, summed, at, depth)
    return [x] if x is not None else []


def _reduces_everything(index: Index, expr: ast.expr, at: ast.AST) -> bool:
    """`torch.sum(e)` / `e.sum()` with no dimension: one number for the whole tensor."""
    expr = _follow(index, expr, at)
    if not isinstance(expr, ast.Call) or _reduced(index, expr) is None:
        return False
    dims = expr.args[1:] if index.resolve(expr.func) in _REDUCTIONS else expr.args
    return not dims and not any(k.arg in ("dim", "axis") for k in expr.keywords)


def _added_exponentials(index: Index, terms: list[ast.expr], at: ast.AST, depth: int) -> list[ast.expr]:
    """`exp(a) + exp(b)`, `1 + torch.sum(torch.exp(x), 2)` (the N-pair loss): exponentials, sums of them and
    constants (a constant is exp of a constant). `1 + exp(x)` alone is softplus by hand, left alone."""
    exponents: list[ast.expr] = []
    reductions = 0
    for term in terms:
        if isinstance(term, ast.Constant) and isinstance(term.value, int | float):
            continue
        value = _follow(index, term, at) if depth < _DEPTH else term
        summed = _reduced(index, value)
        x = _exponent(index, summed, value, depth + 1) if summed is not None else _exponent(index, term, at, depth)
        if x is None:
            return []
        reductions += summed is not None
        exponents.append(x)
    return exponents if reductions or len(exponents) >= 2 else []


def _added_terms(expr: ast.expr) -> list[ast.expr]:
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _added_terms(expr.left) + _added_terms(expr.right)
    return [expr]


def _reduced(index: Index, expr: ast.expr) -> ast.expr | None:
    """What a sum or mean reduces: `torch.sum(a, ...)`, `a.sum(...)`."""
    if not isinstance(expr, ast.Call):
        return None
    q = index.resolve(expr.func)
    if q in _REDUCTIONS:
        return kwarg(expr, "input", 0)
    func = expr.func
    if q is None and isinstance(func, ast.Attribute) and func.attr in ("sum", "mean"):
        return func.value
    return None


def _exponent(index: Index, expr: ast.expr, at: ast.AST, depth: int) -> ast.expr | None:
    """x for `torch.exp(x)` / `x.exp()`, also masked (`torch.exp(x) * mask`) or through a name."""
    if depth < _DEPTH and isinstance(expr, ast.Name):
        value = _follow(index, expr, at)
        return None if value is expr else _exponent(index, value, value, depth + 1)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return _exponent(index, expr.left, at, depth) or _exponent(index, expr.right, at, depth)
    if not isinstance(expr, ast.Call):
        return None
    return _elementwise_operand(index, expr, "exp")


def _shift(index: Index, x: ast.expr, at: ast.AST) -> str:
    """How the exponent is shifted: "none", "row" (minus a maximum taken along a dimension: stable), "global"
    (minus the maximum of the whole tensor), "other" (minus something else, which may well bound it)."""
    x = _follow(index, x, at)
    if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Div):
        x = _follow(index, x.left, at)  # `(x - m) / temperature`
    if not (isinstance(x, ast.BinOp) and isinstance(x.op, ast.Sub)):
        return "none"
    return _maximum(index, _follow(index, x.right, at))


def _maximum(index: Index, m: ast.expr) -> str:
    """"row" for a maximum along a dimension, "global" for one over the whole tensor, "other" for anything else."""
    while True:
        if isinstance(m, ast.Subscript):  # `x.max(1)[0]`
            m = m.value
        elif isinstance(m, ast.Attribute) and m.attr in ("values", "data"):  # `x.max(1).values`
            m = m.value
        elif isinstance(m, ast.Call) and isinstance(m.func, ast.Attribute) and m.func.attr in ("detach", "unsqueeze", "view", "expand_as", "expand"):
            m = m.func.value
        else:
            break
    if not isinstance(m, ast.Call):
        return "other"
    q = index.resolve(m.func)
    if q in _MAX_FUNCTIONS:
        has_dim = len(m.args) > 1 or any(k.arg in ("dim", "axis") for k in m.keywords)
        return "row" if has_dim else "global"
    func = m.func
    if q is None and isinstance(func, ast.Attribute) and func.attr in _MAX_METHODS:
        has_dim = bool(m.args) or any(k.arg in ("dim", "axis") for k in m.keywords)
        return "row" if has_dim else "global"
    return "other"

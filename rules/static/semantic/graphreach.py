"""Whether a value can carry autograd history back to a model's parameters: the question a loss term asks.

A loss is a sum of terms, and backward trains through a term only along paths that keep their history. A term whose
every path to a model is cut trains nothing while it still moves the number printed as the loss, and the cut is
rarely on the term itself: it sits on an input several statements up (`recon = decoder(z).detach()` then
`rec = F.mse_loss(recon, x)`), on the model's output read as `.data`, in a `with torch.no_grad():` block that holds
the student's forward as well as the teacher's, or in a term rebuilt from numbers (`torch.tensor([...item()])`).

`reach(index, expr)` follows an expression through the function's own assignments and says, for the whole value:

- `LIVE`: some path reaches a model call made with grad on (a module of the file, `self.model(...)`);
- `CUT`: every path that came from a model or a tensor value passes a cut (`.detach()`, `.item()`, `.data`,
  `float()`, `torch.tensor(...)`, a value computed under `no_grad`), with the first such cut to name;
- `NONE`: no model anywhere (numbers, data from a loader, `torch.randn`);
- `UNKNOWN`: a path the function cannot see the end of (a parameter, an attribute, a call of something unknown).

Joining paths, one LIVE path makes the value LIVE, an UNKNOWN one keeps it from being CUT (a parameter may hold the
codebook of a VQ-VAE, whose `F.mse_loss(self.codebook, z.detach())` trains the codebook), and CUT only stands when
nothing else reaches a model. A weight that multiplies a term (a number, a config attribute, a bare hyper-parameter
name) is skipped, as it is no path of the term's. Bounded depth; no second parse: the index's definitions only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from torchdoctor.rules.static.semantic.subtree import subtree

LIVE, UNKNOWN, CUT, NONE = "live", "unknown", "cut", "none"
_ORDER = {LIVE: 3, UNKNOWN: 2, CUT: 1, NONE: 0}

# Methods whose result holds no autograd history, and builtins that turn a tensor into a Python number.
_CUT_METHODS = frozenset({"detach", "item", "tolist", "numpy"})
_CUT_BUILTINS = frozenset({"float", "int"})
# Calls that build a new tensor from what they are given, without its history.
_REBUILT = frozenset({"torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor", "torch.FloatTensor",
                      "numpy.array", "numpy.asarray"})
# Calls that make fresh values with no history of any model.
_FRESH_PREFIXES = ("torch.rand", "torch.zeros", "torch.ones", "torch.full", "torch.empty", "torch.arange",
                   "torch.linspace", "torch.eye", "numpy.", "math.", "random.")


@dataclass(frozen=True)
class Reach:
    state: str
    cut: ast.AST | None = None  # the first cut on the way (where the fix goes)
    how: str = ""  # `.detach()`, `.data`, `torch.tensor(...)`, `no_grad`


_NONE = Reach(NONE)
_UNKNOWN = Reach(UNKNOWN)
_LIVE = Reach(LIVE)


def join(*reaches: Reach) -> Reach:
    """The value of an expression that several paths feed: the strongest path wins, the first cut is kept."""
    best = _NONE
    for r in reaches:
        if _ORDER[r.state] > _ORDER[best.state]:
            best = r
    return best


def is_weight(index, expr: ast.AST) -> bool:
    """A factor that scales a term and is no path of it: a number, a config attribute (`self.l1_weight`,
    `args.beta`), a bare name the function never computes (a hyper-parameter)."""
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, int | float)
    if isinstance(expr, ast.UnaryOp):
        return is_weight(index, expr.operand)
    if isinstance(expr, ast.Attribute):
        return expr.attr != "data" and isinstance(expr.value, ast.Name | ast.Attribute)
    return isinstance(expr, ast.Name) and not index.definitions(expr.id, expr) and not _loop_target(index, expr)


def reach(index, expr: ast.AST | None, depth: int = 0) -> Reach:
    if expr is None or depth > 12:
        return _UNKNOWN
    if isinstance(expr, ast.Constant | ast.JoinedStr):
        return _NONE
    if isinstance(expr, ast.Name):
        return _name(index, expr, depth)
    if isinstance(expr, ast.Attribute):
        if expr.attr == "data":
            inner = reach(index, expr.value, depth + 1)
            return Reach(CUT, expr, ".data") if inner.state != NONE else _NONE
        return _UNKNOWN  # `self.codebook`, `model.weight`: may be a parameter
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.Mult | ast.Div):
            if is_weight(index, expr.right):
                return reach(index, expr.left, depth + 1)
            if isinstance(expr.op, ast.Mult) and is_weight(index, expr.left):
                return reach(index, expr.right, depth + 1)
        return join(reach(index, expr.left, depth + 1), reach(index, expr.right, depth + 1))
    if isinstance(expr, ast.UnaryOp):
        return reach(index, expr.operand, depth + 1)
    if isinstance(expr, ast.Subscript):
        return reach(index, expr.value, depth + 1)
    if isinstance(expr, ast.IfExp):
        return join(reach(index, expr.body, depth + 1), reach(index, expr.orelse, depth + 1))
    if isinstance(expr, ast.Tuple | ast.List | ast.Set):
        return join(*(reach(index, e, depth + 1) for e in expr.elts))
    if isinstance(expr, ast.ListComp | ast.GeneratorExp | ast.SetComp):
        return reach(index, expr.elt, depth + 1)
    if isinstance(expr, ast.Call):
        return _call(index, expr, depth)
    return _UNKNOWN


def _loop_target(index, name: ast.Name) -> bool:
    """A name bound by a `for` of the function (`for x, y in loader`): a batch of data, which carries no model."""
    fn = index.function_of(name)
    for anc in index.ancestors(name):
        if isinstance(anc, ast.For | ast.AsyncFor) and any(
                isinstance(t, ast.Name) and t.id == name.id for t in subtree(anc.target)):
            return True
        if anc is fn:
            break
    return False


def _scope_facts(index, name: ast.Name) -> tuple[set[str], dict[str, list[ast.expr]]]:
    """For the scope of a name, one walk: the names an augmented assignment rebinds, and what `.append`/`.extend`/
    `.insert` put into each list (kept on the index: every term of every loss asks, and a walk per question
    was a large share of the rule's cost)."""
    scope = index.function_of(name) or index.tree
    memo = index.__dict__.setdefault("_graphreach_scopes", {})
    facts = memo.get(id(scope))
    if facts is None:
        rebound: set[str] = set()
        grown: dict[str, list[ast.expr]] = {}
        for n in subtree(scope):
            if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
                rebound.add(n.target.id)
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _GROWERS \
                    and n.args and isinstance(n.func.value, ast.Name):
                grown.setdefault(n.func.value.id, []).append(n.args[-1])
        facts = memo[id(scope)] = (rebound, grown)
    return facts


def _rebound_in_place(index, name: ast.Name) -> bool:
    """`reg += p.norm()`: an augmented assignment the definitions do not list, which may add a live path."""
    return name.id in _scope_facts(index, name)[0]


_GROWERS = frozenset({"append", "extend", "insert"})


def _grown_with(index, name: ast.Name) -> list[ast.expr]:
    """What `log_probs.append(dist.log_prob(a))` and the like put into a list the function filled by calls: the
    assignment the definitions list is only its empty start (`log_probs = []`, A2C's rollout buffers)."""
    return _scope_facts(index, name)[1].get(name.id, [])


def _name(index, name: ast.Name, depth: int) -> Reach:
    values = index.definitions(name.id, name)
    if not values:
        return _NONE if _loop_target(index, name) else _UNKNOWN
    if _rebound_in_place(index, name):
        return _UNKNOWN
    values = [*values, *_grown_with(index, name)]
    found = []
    for value in values:
        stmt = index.statement_of(value)
        r = reach(index, value, depth + 1)
        if r.state == LIVE and stmt is not None and index.grad_disabled(stmt):
            r = Reach(CUT, stmt, "no_grad")  # computed with autograd off: the value has no history
        found.append(r)
    return join(*found)


def _call(index, call: ast.Call, depth: int) -> Reach:
    func = call.func
    args = [*call.args, *(k.value for k in call.keywords if k.arg != "requires_grad")]
    if isinstance(func, ast.Attribute) and func.attr in _CUT_METHODS and not call.args:
        inner = reach(index, func.value, depth + 1)
        if inner.state == UNKNOWN and isinstance(func.value, ast.Name) and not index.definitions(
                func.value.id, func.value):
            return _UNKNOWN  # a parameter detached: what it holds, and whether its caller trains it, is not known here
        return Reach(CUT, call, f".{func.attr}()") if inner.state != NONE else _NONE
    q = index.resolve(func)
    if isinstance(func, ast.Name) and func.id in _CUT_BUILTINS and len(call.args) == 1:
        inner = reach(index, call.args[0], depth + 1)
        return Reach(CUT, call, f"{func.id}()") if inner.state not in (NONE, UNKNOWN) else inner
    if q in _REBUILT:
        if any(k.arg == "requires_grad" for k in call.keywords):
            return _UNKNOWN  # a new leaf that trains itself
        inner = join(*(reach(index, a, depth + 1) for a in args))
        return Reach(CUT, call, f"{ast.unparse(func)}(...)") if inner.state in (LIVE, CUT) else inner
    if q is not None and q.startswith(_FRESH_PREFIXES):
        return _NONE
    if _model_call(index, func):
        if index.grad_disabled(call):
            return Reach(CUT, call, "no_grad")
        return _LIVE
    if isinstance(func, ast.Attribute) and (q is None or isinstance(func.value, ast.Name) and index.definitions(
            func.value.id, func.value)):
        # a method of a value (`x.abs().mean()`, `out.view(-1)`): the receiver's paths and the arguments'. Also
        # when the resolver reads a local variable's name as a module alias: after `dist, value = model(s)`,
        # `dist.log_prob(a)` is the distribution's method, not torch.distributed's (A2C's actor loss)
        return join(reach(index, func.value, depth + 1), *(reach(index, a, depth + 1) for a in args))
    if q is not None and q.startswith("torch.") or _criterion(index, func):
        return join(*(reach(index, a, depth + 1) for a in args))  # a torch function or a loss: its inputs' paths
    return _UNKNOWN


def _model_call(index, func: ast.AST) -> bool:
    """The callee is a module whose parameters the step trains: a module binding (`decoder = nn.Linear(...)`,
    `self.model = model` of a module), `self` in a Module."""
    if not isinstance(func, ast.Name | ast.Attribute):
        return False
    b = index.binding(func)
    if b is not None:
        return b.kind == "module"
    return isinstance(func, ast.Name) and func.id == "self" and index.is_model(func) or isinstance(
        func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" and index.is_model(func)


def _criterion(index, func: ast.AST) -> bool:
    """A loss object (`crit = nn.CrossEntropyLoss()`): a function of its inputs, with no parameters of its own."""
    b = index.binding(func)
    return b is not None and b.kind == "loss"


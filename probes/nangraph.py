"""The op that made a non-finite loss, read from the loss's own autograd graph.

When neither the replay of the step's module and loss-function calls nor the op watch of the next steps can
place a non-finite loss (a `0 / 0` written inline in a Trainer's `compute_loss`, whose nan gradients make every
later loss non-finite from the weights on), the graph of the bad loss still holds what each op saved for its
backward. Walking down from the loss while the path is unambiguous, the first node whose saved inputs are
finite and whose own precondition fails on them (a zero divisor, the log of a non-positive value, a mean over
zero targets) or that saved a non-finite result of its own (`exp`, `sqrt`) made the non-finite value. Its name (`Div`, `NllLoss`, `Log`) goes to the analysis, which finds the one line of the
script's loss code that writes that op (doctor/analysis/source.py `op_line`).

Cost: nothing until a non-finite loss no replay placed; then a walk of at most `MAX_NODES` graph nodes, once.
"""

from __future__ import annotations

import math
import re
from typing import Any

from torchdoctor.probes.nanlocate import finite

MAX_NODES = 64
_BACKWARD = re.compile(r"Backward\d*$")


def culprit_op(loss: Any, torch: Any) -> str | None:
    """The name only (see `culprit`)."""
    found = culprit(loss, torch)
    return found[0] if found else None


def culprit(loss: Any, torch: Any) -> tuple[str, list[str]] | None:
    """The autograd op that turned finite inputs into the non-finite loss, and the ops that made its inputs
    (`Mul` of `Exp` and `LogSoftmax`: which of several `*` lines it is). A NaN made from inputs that held
    infinities but no NaN (`0 * -inf`, `inf / inf`: the entropy of a distribution masked with -inf) is looked for
    only when no op made a non-finite value from finite inputs: an intended -inf (a mask) is not the bug, the
    product that turns it into NaN is."""
    for made_here in (_made_here, _nan_made_here):
        found = _walk(loss, torch, made_here)
        if found is not None:
            return found
    return None


def _walk(loss: Any, torch: Any, made_here: Any) -> tuple[str, list[str]] | None:
    """The name of the autograd op that turned finite inputs into the non-finite loss, or None when none is found
    or the branches of the graph show different ones (the walk never guesses between them). Where the path forks
    (`actor_loss + kl`, both made by the same masked mean), every branch is walked, none below the op that made
    its non-finite value, `MAX_NODES` nodes at most."""
    found: dict[str, list[str]] = {}
    seen: set[int] = set()
    todo = [getattr(loss, "grad_fn", None)]
    budget = MAX_NODES
    while todo and budget > 0:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        budget -= 1
        if made_here(node, torch):
            found.setdefault(_name(node), [_name(n) for n, _ in node.next_functions
                                           if n is not None and type(n).__name__ != "AccumulateGrad"])
            continue
        todo.extend(n for n, _ in node.next_functions if n is not None and type(n).__name__ != "AccumulateGrad")
    return next(iter(found.items())) if len(found) == 1 else None


def _made_here(node: Any, torch: Any) -> bool:
    """This op, on the finite inputs it saved, gives a non-finite output: by its own precondition (a zero divisor,
    the log of a non-positive value, a mean over zero targets), or by the non-finite result it saved itself."""
    inputs, results = _saved(node)
    if not all(_finite(v, torch) for v in inputs.values()):
        return False
    name = _name(node)
    if results and not all(_finite(v, torch) for v in results):
        # exp, sqrt, rsqrt, reciprocal keep their result: an overflow or a nan made here; a log-softmax's result
        # is finite for finite inputs, so its -inf came with its input (a mask), which it does not save
        return name not in ("LogSoftmax", "Softmax") or _any(results[0], torch, lambda t: t.isnan())

    if name == "Div":
        return _any(inputs.get("_saved_other"), torch, lambda t: t == 0)
    if name in ("Log", "Log2", "Log10"):
        return _any(inputs.get("_saved_self"), torch, lambda t: t <= 0)
    if name == "Log1p":
        return _any(inputs.get("_saved_self"), torch, lambda t: t <= -1)
    if name in ("Acos", "Asin"):
        return _any(inputs.get("_saved_self"), torch, lambda t: t.abs() > 1)
    if name == "NllLoss":
        return _any(inputs.get("_saved_total_weight"), torch, lambda t: t == 0)
    return False


def _nan_made_here(node: Any, torch: Any) -> bool:
    """A NaN made here from inputs that held no NaN, some of them infinite: `0 * inf` in a product, `inf / inf` or
    `0 / 0` in a division (the ops that save both operands)."""
    name = _name(node)
    if name not in ("Mul", "Div"):
        return False
    inputs, _ = _saved(node)
    a, b = inputs.get("_saved_self"), inputs.get("_saved_other")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    with torch.no_grad():
        a, b = a.detach(), b.detach()
        if a.isnan().any() or b.isnan().any():
            return False
        try:
            made = (a * b if name == "Mul" else a / b).isnan()
        except RuntimeError:  # shapes that only broadcast in the op's own layout: no verdict
            return False
        return bool(made.any())


def _any(value: Any, torch: Any, test: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = torch.tensor(float(value))
    if not isinstance(value, torch.Tensor) or value.numel() == 0:
        return False
    with torch.no_grad():
        return bool(test(value.detach()).any())


def _saved(node: Any) -> tuple[dict[str, Any], list[Any]]:
    inputs: dict[str, Any] = {}
    results: list[Any] = []
    for attr in dir(node):
        if not attr.startswith("_saved_") or attr.startswith("_saved_tensors"):
            continue
        try:
            value = getattr(node, attr)
        except Exception:  # noqa: BLE001 - freed by an earlier backward, or not readable: not evidence
            continue
        if attr.startswith("_saved_result"):
            results.append(value)
        else:
            inputs[attr] = value
    return inputs, results


def _finite(value: Any, torch: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return finite(value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(v, torch) for v in value[:16])
    return True


def _name(node: Any) -> str:
    return _BACKWARD.sub("", type(node).__name__)


# Ops whose derivative is infinite at a finite input: at that point their backward turns a finite gradient into
# inf/NaN while the forward stayed finite (sqrt(0) = 0, but d/dx sqrt at 0 is inf)
SINGULAR = ("Sqrt", "Rsqrt", "Pow", "Norm", "LinalgVectorNorm", "Acos", "Asin", "Cdist")
# Below a `torch.where` the forward may compute log(0) or x / 0 in the branch it then discards: the loss stays
# finite, but the discarded branch's backward multiplies a zero gradient by an infinite derivative (0 * inf = NaN).
# Those ops count there only (a log or a division elsewhere in a graph is everywhere and usually harmless).
MASKED = (*SINGULAR, "Log", "Log2", "Log10", "Log1p", "Div", "Reciprocal")
_WHERE_REACH = 4  # graph nodes below a Where still counted as its branch


def singular_op(graph: Any, limit: int = 400) -> tuple[str, bool] | None:
    """The one kind of op with a singular derivative in a graph after its backward (the saved tensors are gone,
    the node types and saved numbers stay): None when there is none or more than one kind. A power counts only
    with an exponent below 1 (x ** 2 is smooth). An op inside a branch of a `torch.where` (a few nodes below it)
    comes first: that is the shape in which the forward stays finite and only the gradient is NaN. With whether it
    was one (True)."""
    kinds: set[str] = set()
    masked: set[str] = set()
    seen: set[int] = set()
    todo: list[tuple[Any, int]] = [(graph, 0)]
    while todo and len(seen) < limit:
        node, reach = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        name = _name(node)
        if name in MASKED:
            exponent = getattr(node, "_saved_exponent", None) if name == "Pow" else None
            if name != "Pow" or (isinstance(exponent, (int, float)) and 0 < exponent < 1):
                if name in SINGULAR:
                    kinds.add(name)
                if reach:
                    masked.add(name)
        below = _WHERE_REACH if name == "Where" else max(reach - 1, 0)
        todo.extend((n, below) for n, _ in node.next_functions
                    if n is not None and type(n).__name__ != "AccumulateGrad")
    if len(masked) == 1:
        return next(iter(masked)), True
    return (next(iter(kinds)), False) if len(kinds) == 1 else None

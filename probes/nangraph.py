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
    """The name of the autograd op that turned finite inputs into the non-finite loss, or None when none is found
    or the branches of the graph show different ones (the walk never guesses between them). Where the path forks
    (`actor_loss + kl`, both made by the same masked mean), every branch is walked, none below the op that made
    its non-finite value, `MAX_NODES` nodes at most."""
    found: set[str] = set()
    seen: set[int] = set()
    todo = [getattr(loss, "grad_fn", None)]
    budget = MAX_NODES
    while todo and budget > 0:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        budget -= 1
        if _made_here(node, torch):
            found.add(_name(node))
            continue
        todo.extend(n for n, _ in node.next_functions if n is not None and type(n).__name__ != "AccumulateGrad")
    return next(iter(found)) if len(found) == 1 else None


def _made_here(node: Any, torch: Any) -> bool:
    """This op, on the finite inputs it saved, gives a non-finite output: by its own precondition (a zero divisor,
    the log of a non-positive value, a mean over zero targets), or by the non-finite result it saved itself."""
    inputs, results = _saved(node)
    if not all(_finite(v, torch) for v in inputs.values()):
        return False
    if results and not all(_finite(v, torch) for v in results):
        return True  # exp, sqrt, rsqrt, reciprocal keep their result: an overflow or a nan made here
    name = _name(node)
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

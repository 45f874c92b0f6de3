"""Probabilities fed to a loss that expects logits, read from the loss's own autograd graph.

`cross_entropy(x)` is `nll_loss(log_softmax(x))`: in the graph of a loss it
shows as a `LogSoftmaxBackward0` (under an `NllLossBackward0`). When what
reached it was already a probability — the output of a softmax, or `exp` of a
log_softmax — the loss takes a second softmax: its gradient is squashed and
training stalls. `nll_loss` straight on a softmax (no log at all) is the same
mistake. Only shape-only ops (view, reshape, permute, slicing…) and products
with a constant matrix (attention weights over the support set's one-hot
labels, as matching networks compute class probabilities) may sit in
between: anything else that computes on the probabilities first (a learned
mixture, a temperature) is the script's own business.

`find_double_softmax(root)` walks the first `MAX_NODES` nodes from the root,
breadth first (the loss's own ops sit next to the root; the model's thousands
of nodes are never reached), and returns the softmax node or None.

`SoftmaxSites` names the user's line: armed after a graph showed the
mistake, it wraps `torch.softmax`, `torch.nn.functional.softmax`,
`Tensor.softmax` and `torch.exp`/`Tensor.exp` until the next backward (one
step), remembering the node each call created and where; `site_of(node)`
then answers. Nothing is wrapped outside that one step but `nn.Softmax`'s
constructor, which notes where each softmax module is built (no per-step
cost): a softmax module inside a container (`nn.Sequential(..., nn.Softmax())`)
runs from torch's frames only, and its line is the one that put it there.
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from typing import Any

from torchdoctor.probes.patches import user_site
from torchdoctor.probes.sites import as_dict, here
from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import is_library_file

MAX_NODES = 200
SHAPE_ONLY = {
    "ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "PermuteBackward0", "TransposeBackward0",
    "TBackward0", "SqueezeBackward0", "SqueezeBackward1", "UnsqueezeBackward0", "SliceBackward0",
    "SelectBackward0", "CloneBackward0", "ToCopyBackward0", "ExpandBackward0", "IndexBackward0",
    "ContiguousBackward0", "FlattenBackward0",
}
CONSTANT_MIXING = {"BmmBackward0", "MmBackward0"}
PROBABILITY = {"SoftmaxBackward0"}
LOGITS_LOSSES = {"LogSoftmaxBackward0"}
NLL = {"NllLossBackward0", "NllLoss2DBackward0", "NllLossNdBackward0"}


def _source(node: Any) -> Any:
    """Through shape-only ops, and products with a constant (a distribution weighting one-hot labels stays a
    distribution: matching/prototype classifiers), the node that computed what `node` consumes."""
    for _ in range(8):
        nexts = [n for n, _ in getattr(node, "next_functions", ()) if n is not None]
        if not nexts:
            return None
        node = nexts[0]
        name = node.name()
        if name in SHAPE_ONLY:
            continue
        if name in CONSTANT_MIXING and sum(n is not None for n, _ in node.next_functions) == 1:
            continue  # the other operand carries no graph: a constant matrix, such as the support set's labels
        return node
    return None


def _is_probability(node: Any) -> bool:
    if node is None:
        return False
    name = node.name()
    if name in PROBABILITY:
        return True
    if name == "ExpBackward0":  # exp(log_softmax(x)): a softmax written out
        inner = _source(node)
        return inner is not None and inner.name() == "LogSoftmaxBackward0"
    return False


def find_double_softmax(root: Any) -> tuple[Any, str] | None:
    """(the node that made the probabilities, the loss op they reached) in `root`'s graph, or None."""
    start = getattr(root, "grad_fn", None)
    if start is None:
        return None
    seen = {id(start)}
    todo = deque([start])
    visited = 0
    while todo and visited < MAX_NODES:
        node = todo.popleft()
        visited += 1
        name = node.name()
        if name in LOGITS_LOSSES or name in NLL:
            source = _source(node)
            if _is_probability(source):
                return source, "log_softmax" if name in LOGITS_LOSSES else "nll_loss"
        for child, _ in getattr(node, "next_functions", ()):
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                todo.append(child)
    return None


class SoftmaxSites:
    """Wraps the softmax-making calls for one step and remembers which node each call created, and where."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.sites: list[tuple[Any, dict[str, Any] | None]] = []
        self._saved: list[tuple[Any, str, Any, bool]] = []  # (owner, name, original, owned: in owner's own dict)
        self.armed = False  # a plain attribute: read on every backward
        self.built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # nn.Softmax module -> its line
        self._softmax_forward = torch.nn.Softmax.forward.__code__
        self._watch_construction(torch.nn.Softmax)

    def _watch_construction(self, cls: Any) -> None:
        built = self.built
        original = cls.__init__
        self._construction = (cls, original, "__init__" in vars(cls))

        def __init__(module: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the method it wraps
            original(module, *args, **kwargs)
            if len(built) < 64:
                site = user_site(sys._getframe(1))
                if site is not None:
                    built[module] = as_dict(site)

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        cls.__init__ = transparent(__init__)
        self._construction_wrapper = cls.__init__

    def close(self) -> None:
        """Put nn.Softmax's constructor back (a `watch()` block, a test: the process goes on without us)."""
        self.disarm()
        cls, original, owned = self._construction
        if vars(cls).get("__init__") is self._construction_wrapper:
            if owned:
                cls.__init__ = original
            else:
                delattr(cls, "__init__")

    def _module_site(self, frame: Any) -> dict[str, Any] | None:
        """A softmax made by an nn.Softmax module called from a library container (Sequential): the line that built
        the module. None when the module's caller is the user's own forward (that call is the line)."""
        for _ in range(8):
            if frame is None:
                return None
            if frame.f_code is self._softmax_forward:
                module = frame.f_locals.get("self")
                caller = frame.f_back
                while caller is not None and caller.f_code.co_name in ("_call_impl", "_wrapped_call_impl"):
                    caller = caller.f_back
                if caller is None or not is_library_file(caller.f_code.co_filename):
                    return None
                try:
                    return self.built.get(module)
                except TypeError:
                    return None
            frame = frame.f_back
        return None

    def arm(self) -> None:
        if self._saved:
            return
        torch = self.torch
        targets = [(torch, "softmax"), (torch.nn.functional, "softmax"), (torch.Tensor, "softmax"),
                   (torch, "exp"), (torch.Tensor, "exp")]
        for owner, name in targets:
            original = getattr(owner, name, None)
            if original is None:
                continue
            self._saved.append((owner, name, original, name in vars(owner)))
            setattr(owner, name, self._wrap(original))
        self.armed = bool(self._saved)

    def disarm(self) -> None:
        for owner, name, original, owned in reversed(self._saved):
            if owned:
                setattr(owner, name, original)
            else:  # inherited (Tensor.exp lives on TensorBase): remove ours, leave the class as it was
                delattr(owner, name)
        self._saved = []
        self.armed = False

    def _wrap(self, original: Any) -> Any:
        sites = self.sites

        module_site = self._module_site

        def watched(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            node = getattr(out, "grad_fn", None)
            if node is not None and len(sites) < 256:
                sites.append((node, module_site(sys._getframe(1)) or here()))
            return out

        watched.__wrapped__ = original  # type: ignore[attr-defined]
        watched.__doc__ = getattr(original, "__doc__", None)
        return watched

    def site_of(self, node: Any) -> dict[str, Any] | None:
        for made, site in self.sites:
            if made is node:
                return site
        return None

    def clear(self) -> None:
        self.sites = []

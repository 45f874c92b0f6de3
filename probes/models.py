"""Find the script's models and name their modules the way the user would.

The probes know the parameters (from the optimizer, or from the loss's
autograd graph) but not the `nn.Module` objects that own them. `find_models`
looks them up once — one pass over the objects the garbage collector tracks
(10-50 ms, the cost of one memory census) — and keeps the top-level ones:
modules that own some of the parameters and are nobody's child. A compiled
model (`torch.compile` → OptimizedModule) and a DDP wrapper are top-level
modules whose `_orig_mod` / `module` is what really runs.

Names: the variable that holds the model in the user's frames (`model`), else
its class name; submodules get their qualified names (`model.encoder.0`).
Layers are the modules that own parameters directly, in execution order when
it was observed, else in registration order.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from torchdoctor.probes.userframes import is_library_file


def unwrap(module: Any) -> Any:
    """The module that really computes: through torch.compile's and DDP/FSDP's wrappers."""
    for _ in range(4):
        inner = getattr(module, "_orig_mod", None)
        if inner is None and type(module).__name__ in ("DistributedDataParallel", "DataParallel",
                                                        "FullyShardedDataParallel"):
            inner = getattr(module, "module", None)
        if inner is None:
            return module
        module = inner
    return module


def is_compiled(module: Any) -> bool:
    return getattr(module, "_orig_mod", None) is not None


def called_parts(torch: Any, module: Any) -> list[Any]:
    """The modules a script calls for `module`'s forward: itself, or, for a container with no
    forward of its own (`nn.ModuleDict`, `nn.ModuleList`), its children, recursively."""
    unimplemented = getattr(torch.nn.modules.module, "_forward_unimplemented", None)
    if getattr(type(module), "forward", None) is not unimplemented:
        return [module]
    return [part for child in module.children() for part in called_parts(torch, child)]


def find_models(torch: Any, params: list[Any]) -> list[Any]:
    """Top-level modules owning any of `params`, in the order their first parameter appears."""
    wanted = {id(p) for p in params}
    if not wanted:
        return []
    module_type = torch.nn.Module
    modules = [o for o in gc.get_objects() if issubclass(type(o), module_type)]  # type(): no __class__ lookups
    children: set[int] = set()
    for m in modules:
        for child in getattr(m, "_modules", {}).values():
            if child is not None:
                children.add(id(child))
    first_index: dict[int, int] = {}
    order = {pid: i for i, pid in enumerate(id(p) for p in params)}
    for m in modules:
        if id(m) in children:
            continue
        try:
            owned = [order[id(p)] for p in m.parameters() if id(p) in wanted]
        except Exception:  # noqa: BLE001 - a half-built module
            continue
        if owned:
            first_index[id(m)] = min(owned)
    roots = [m for m in modules if id(m) in first_index]
    del modules
    roots.sort(key=lambda m: first_index[id(m)])
    return roots


def variable_name(obj: Any, frame: FrameType | None) -> str | None:
    """The name a user frame (innermost first), or its module's globals, binds to `obj`."""
    while frame is not None:
        if not is_library_file(frame.f_code.co_filename):
            for scope in (frame.f_locals, frame.f_globals):
                for name, value in list(scope.items()):
                    if value is obj and not name.startswith("_"):
                        return name
                    if name == "self" and value is not None:
                        for attr, inner in list(getattr(value, "__dict__", {}).items()):
                            if inner is obj:
                                return f"self.{attr}"
        frame = frame.f_back
    return None


@dataclass
class Layer:
    label: str  # "model.fc1"
    module_type: str  # "Linear"
    params: list[tuple[str, Any]]  # (parameter label "model.fc1.weight", parameter)


@dataclass
class ModelMap:
    """Labels for every module and parameter of the script's models."""

    roots: list[Any]
    root_labels: list[str]
    modules: dict[int, str] = field(default_factory=dict)  # id(module) -> label
    types: dict[int, str] = field(default_factory=dict)
    params: dict[int, str] = field(default_factory=dict)  # id(param) -> label
    owner: dict[int, str] = field(default_factory=dict)  # id(param) -> owning module's label
    layers: list[Layer] = field(default_factory=list)

    @classmethod
    def build(cls, torch: Any, params: list[Any], frame: FrameType | None = None,
              order: list[int] | None = None) -> ModelMap:
        roots = find_models(torch, params)
        frame = frame or sys._getframe(1)
        labels = []
        for root in roots:
            name = variable_name(root, frame) or type(unwrap(root)).__name__
            while name in labels:
                name += "_"
            labels.append(name)
        out = cls(roots=roots, root_labels=labels)
        layers: dict[int, Layer] = {}
        for root, label in zip(roots, labels, strict=True):
            inner = unwrap(root)
            out.modules[id(root)] = label
            out.types[id(root)] = type(inner).__name__
            for qual, module in inner.named_modules():
                mlabel = f"{label}.{qual}" if qual else label
                out.modules[id(module)] = mlabel
                out.types[id(module)] = type(module).__name__
                own = [(f"{mlabel}.{n}", p) for n, p in module.named_parameters(recurse=False)]
                for plabel, p in own:
                    out.params[id(p)] = plabel
                    out.owner[id(p)] = mlabel
                if own:
                    layers[id(module)] = Layer(mlabel, type(module).__name__, own)
        if order:
            ranked = {mid: i for i, mid in enumerate(dict.fromkeys(order))}
            position = {mid: i for i, mid in enumerate(layers)}
            ordered = sorted(layers, key=lambda mid: (ranked.get(mid, len(ranked)), position[mid]))
            out.layers = [layers[mid] for mid in ordered]
        else:
            out.layers = list(layers.values())
        return out

    def label(self, module: Any) -> str:
        return self.modules.get(id(module), type(module).__name__)

"""Undo the probes' changes to torch when an in-process session ends (`torchdoctor.watch`).

In `torchdoctor run` the probes live as long as the script's process, so
they install and never uninstall. `torchdoctor.watch()` runs them inside the
user's own process around one block of code: after the block, the process
must be as it was — `torch.save` is torch's again, no global hook of ours
runs on the next forward or optimizer step, a second `watch()` (a notebook
cell run twice) installs afresh and counts from zero.

Rather than teaching every probe to uninstall itself, the ledger restores
what the probes touch, judged by ownership, not by a list kept in step with
every probe:

- global hook registries of torch (every `_global_*` dict of
  `torch.nn.modules.module` and `torch.optim.optimizer`): the keys added
  while the session ran are removed;
- attributes of torch's namespaces (modules, and the classes the probes wrap
  with their subclasses) whose value is a function defined by a torchdoctor
  probe: put back to the value before the session, or, for a class first seen
  later, unwrapped through `__wrapped__`;
- hooks of ours on the user's modules (forward hooks the probes put on the
  models they track);
- `warnings.warn`, which probes/transparent.py replaces;
- the probes' per-process singletons (forward, backward, compile, data and
  scaler watches), so the next session builds its own.

What the user changed during the block is theirs and stays: only values that
are ours are touched. No torch import at module level.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

_OURS = os.path.dirname(os.path.abspath(__file__))
# Classes whose methods the probes wrap; their subclasses are scanned too (scheduler classes, data-loader
# iterators, GradScaler). "module:qualname", looked up in sys.modules only (never imported here).
_CLASSES = (
    "torch:Tensor",
    "torch.nn.modules.module:Module",
    "torch.optim.optimizer:Optimizer",
    "torch.optim.lr_scheduler:LRScheduler",
    "torch.utils.data.dataloader:DataLoader",
    "torch.utils.data.dataloader:_BaseDataLoaderIter",
    "torch.utils.data.distributed:DistributedSampler",
    "torch.nn.parallel.distributed:DistributedDataParallel",
    "torch.amp.grad_scaler:GradScaler",
    "torch.amp.autocast_mode:autocast",
    "torch.autograd.function:Function",
    "multiprocessing.process:BaseProcess",
)
_MODULES = ("torch", "torch.autograd", "torch.nn.utils", "torch.nn.utils.clip_grad", "torch.serialization",
            "torch.cuda")
# Dynamo keeps `nn.Module.__init__` as it was when it was first imported (mutation_guard, and the modules that import
# the name from it): imported during the block (a first torch.compile, a package that registers with dynamo), it
# keeps our wrapper unless its modules are restored too.
_DYNAMO = "torch._dynamo"
_HOOK_MODULES = ("torch.nn.modules.module", "torch.optim.optimizer")
_SINGLETONS = (
    ("torchdoctor.probes.forwards", "_WATCH"),
    ("torchdoctor.probes.patches", "_BACKWARD"),
    ("torchdoctor.probes.patches", "_COMPILE"),
    ("torchdoctor.probes.patches", "_DATA"),
    ("torchdoctor.probes.scalers", "_WATCH"),
)
_INSTANCE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_with_kwargs",
                   "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                   "_backward_pre_hooks")


def is_ours(value: Any) -> bool:
    """A function (or method, staticmethod, classmethod, property) whose code is a torchdoctor probe's."""
    if isinstance(value, (staticmethod, classmethod, types.MethodType)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    # only plain functions: getattr on arbitrary objects (torch.classes) may raise or build proxies
    return isinstance(value, types.FunctionType) and value.__code__.co_filename.startswith(_OURS)


def _lookup(spec: str) -> Any:
    module_name, _, name = spec.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        return None
    obj: Any = module
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return obj


def _namespaces() -> list[Any]:
    """Every namespace the probes may have changed that exists now (modules, classes with subclasses)."""
    from torchdoctor.probes.patches import subclasses_of

    out: list[Any] = [sys.modules[m] for m in _MODULES if m in sys.modules]
    out += [m for name, m in list(sys.modules.items())
            if m is not None and (name == _DYNAMO or name.startswith(_DYNAMO + ".")) and m not in out]
    for spec in _CLASSES:
        cls = _lookup(spec)
        if isinstance(cls, type):
            out.append(cls)
            out += [c for c in subclasses_of(cls) if c not in out]
    return out


class Ledger:
    """What torch looked like before a session's probes were installed; `restore()` puts it back."""

    def __init__(self) -> None:
        self.attributes: dict[int, tuple[Any, dict[str, Any]]] = {}
        self.hook_keys: dict[tuple[str, str], set[Any]] = {}
        self.modules: list[Any] = []  # the user's models the probes hooked (weak references)

    def snapshot(self) -> None:
        """Record the current state; call once torch is imported and before any probe installs."""
        for ns in _namespaces():
            self.attributes[id(ns)] = (ns, dict(vars(ns)))
        for module_name in _HOOK_MODULES:
            module = sys.modules.get(module_name)
            for name, value in vars(module or object()).items():
                if name.startswith("_global_") and isinstance(value, dict):
                    self.hook_keys[(module_name, name)] = set(value)

    def restore(self) -> list[str]:
        """Undo every change of ours; return one line per attribute that could not be put back."""
        failures: list[str] = []
        self._remove_instance_hooks()
        for (module_name, name), before in self.hook_keys.items():
            registry = getattr(sys.modules.get(module_name), name, None)
            if isinstance(registry, dict):
                for key in [k for k in registry if k not in before]:
                    registry.pop(key, None)
        for ns in _namespaces():
            saved = self.attributes.get(id(ns))
            before = saved[1] if saved is not None and saved[0] is ns else None
            for name, value in list(vars(ns).items()):
                if not is_ours(value):
                    continue
                original = _original(name, value, before)
                try:
                    if original is _ABSENT:
                        delattr(ns, name)
                    else:
                        setattr(ns, name, original)
                except (AttributeError, TypeError) as exc:
                    failures.append(f"{getattr(ns, '__name__', ns)}.{name}: {exc}")
        for module_name, name in _SINGLETONS:
            module = sys.modules.get(module_name)
            if module is not None:
                setattr(module, name, None)
        _restore_warnings()
        return failures

    def _remove_instance_hooks(self) -> None:
        """Hooks of ours on the user's models: the forward watch's and any probe's on their submodules."""
        watch = getattr(sys.modules.get("torchdoctor.probes.forwards"), "_WATCH", None)
        roots = [ref() for ref in getattr(watch, "models", [])] + [ref() for ref in getattr(watch, "_candidates", [])]
        seen: set[int] = set()
        for root in roots:
            if root is None or not hasattr(root, "modules"):
                continue
            try:
                modules = list(root.modules())
            except Exception:  # noqa: BLE001 - a half-built module
                continue
            for module in modules:
                if id(module) in seen:
                    continue
                seen.add(id(module))
                _drop_our_hooks(module)


_ABSENT = object()


def _restore_warnings() -> None:
    """transparent.py's `warnings.warn` and `_showwarnmsg`, where they are still ours, back to the originals."""
    import warnings

    from torchdoctor.probes import transparent

    if transparent._original_warn is None:
        return
    if warnings.warn is transparent.warn and warnings._showwarnmsg is transparent._showwarnmsg:  # type: ignore[attr-defined]
        warnings.warn = transparent._original_warn
        warnings._showwarnmsg = transparent._original_show  # type: ignore[attr-defined]
        transparent._original_warn = transparent._original_show = None


def _original(name: str, value: Any, before: dict[str, Any] | None) -> Any:
    """The value an attribute had before the session: recorded, or found under the wrappers' __wrapped__."""
    if before is not None:
        return before.get(name, _ABSENT)
    seen = 0
    while is_ours(value) and seen < 16:
        inner = getattr(value, "__wrapped__", None)
        if inner is None:
            return _ABSENT
        value, seen = inner, seen + 1
    return value


def _drop_our_hooks(module: Any) -> None:
    from torchdoctor.probes.forwards import _is_ours

    hooks = getattr(module, "__dict__", {})
    ours: set[Any] = set()
    for attr in ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks"):
        registry = hooks.get(attr)
        if isinstance(registry, dict):
            ours |= {key for key, hook in registry.items() if _is_ours(hook)}
    if not ours:
        return
    for attr in _INSTANCE_HOOKS:
        registry = hooks.get(attr)
        if isinstance(registry, dict):
            for key in ours & set(registry):
                registry.pop(key, None)

"""Which storages would live on the GPU, in what order they come and go, and what each one is.

Runs in the fit child, as a TorchDispatchMode above FakeTensorMode: every aten op the script runs
passes here first. Everything is a fake CPU tensor, so "on the GPU" is tracked here instead:

- a storage made by a call that asked for CUDA (`device="cuda"`, `.cuda()`, `.to("cuda")`, remapped
  by `remap.py`) is on the GPU;
- an op with any GPU input makes GPU outputs (what CUDA would do);
- a factory op (no tensor input) inside the forward of a model on the GPU makes GPU storages
  (`torch.zeros(..., device=x.device)`: `x.device` reads "cpu" here, on the GPU it would not).

Data kept on the host (a dataset built with torch.randint, Adam's step counters) is not counted,
as it would not be on the card. Each GPU storage gets an id; `events` is the ordered list of
("alloc", id, nbytes) and ("free", id, 0) that the allocator replay and the peak read.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ATEN = torch.ops.aten

# What a faked `.item()` / `bool(t)` answers, by the op that made the tensor: the healthy answer,
# so `if torch.isnan(loss): continue` keeps training and `if not torch.isfinite(x).all()` does not skip.
_TRUTH_OF = {"isfinite": True, "isnan": False, "isinf": False}


_RANK = {"parameter": 0, "gradient": 1, "optimizer_state": 2, "activation": 3}


class Tracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int, int]] = []
        self.live: dict[int, tuple[int, int]] = {}  # storage _cdata -> (id, nbytes), GPU storages only
        self.kind: dict[int, str] = {}  # id -> parameter | gradient | optimizer_state | activation
        self.next_id = 0
        self.gpu_request = 0  # > 0 inside a call that asked for CUDA (remap.py)
        self.gpu_forward = 0  # > 0 inside the forward of a module whose parameters are on the GPU
        self.faked_scalars: list[str] = []  # ops whose value the script read (`.item()`): answered, not known
        self.truth: dict[int, bool] = {}  # storage _cdata of a bool tensor -> the answer to give

    # -- storages -------------------------------------------------------------------------------

    def on_gpu(self, t: Any) -> bool:
        try:
            return t.untyped_storage()._cdata in self.live
        except Exception:  # noqa: BLE001 - sparse, nested or storage-less tensors
            return False

    def mark(self, t: Any) -> int | None:
        """Count `t`'s storage as a GPU allocation from now on; its id."""
        try:
            st = t.untyped_storage()
        except Exception:  # noqa: BLE001
            return None
        key = st._cdata
        if key in self.live:
            return self.live[key][0]
        nbytes = st.nbytes()
        ident = self.next_id
        self.next_id += 1
        self.live[key] = (ident, nbytes)
        self.events.append(("alloc", ident, nbytes))
        weakref.finalize(st, self._freed, key, ident)
        return ident

    def _freed(self, key: int, ident: int) -> None:
        entry = self.live.get(key)
        if entry is not None and entry[0] == ident:
            del self.live[key]
            self.events.append(("free", ident, 0))

    def label(self, t: Any, kind: str) -> None:
        """Name what a GPU storage is; the stronger name wins (a weight saved for backward is a
        parameter, not an activation)."""
        try:
            entry = self.live.get(t.untyped_storage()._cdata)
        except Exception:  # noqa: BLE001
            return
        if entry is not None:
            old = self.kind.get(entry[0])
            if old is None or _RANK[kind] < _RANK[old]:
                self.kind[entry[0]] = kind

    # -- ops --------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is ATEN._local_scalar_dense.default:
            return self._scalar(args[0])
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        gpu = any(self.on_gpu(a) for a in inputs) if inputs else (self.gpu_request > 0 or self.gpu_forward > 0)
        out = func(*args, **kwargs)
        if gpu or self.gpu_request:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.mark(t)
        if isinstance(out, torch.Tensor) and out.dtype == torch.bool:
            value = self._truth(func.__name__.split(".")[0], args, inputs)
            key = _key(out)
            if value is not None and key is not None:
                self.truth[key] = value
        return out

    def _truth(self, name: str, args: tuple, inputs: list) -> bool | None:
        """The healthy answer for a bool tensor made by `name`, following the checks scripts write:
        isfinite (which CPU decomposes into `x == x` and `abs(x) != inf`), isnan, isinf, and their
        combinations with all/any/not/and/or."""
        if name in _TRUTH_OF:
            return _TRUTH_OF[name]
        if name in ("eq", "ne") and len(args) >= 2:
            if args[0] is args[1]:
                return name == "eq"  # x == x: not NaN
            if isinstance(args[1], float) and args[1] in (float("inf"), float("-inf")):
                return name == "ne"  # |x| != inf: finite
            return None
        known = [self.truth.get(_key(t)) for t in inputs]
        if not known or any(k is None for k in known):
            return None
        if name in ("all", "any"):
            return known[0]
        if name in ("logical_not", "bitwise_not"):
            return not known[0]
        if name in ("mul", "logical_and", "bitwise_and"):
            return all(known)
        if name in ("logical_or", "bitwise_or", "add"):
            return any(known)
        return None

    def _scalar(self, t: Any) -> Any:
        """`.item()`, `bool(t)`, `int(t)` on a fake tensor: there is no value; answer a harmless one."""
        self.faked_scalars.append(str(t.dtype))
        if t.dtype == torch.bool:
            return self.truth.get(_key(t), False)
        if t.dtype.is_floating_point or t.dtype.is_complex:
            return 1.0
        return 1


def _key(t: Any) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001
        return None

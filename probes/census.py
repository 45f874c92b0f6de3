"""A census of the tensors Python can see, and a walk of autograd graphs.

`take_census` scans the garbage collector's tracked objects for tensors and
groups them by (shape, dtype, device, holds-a-graph, parameter). Bytes count
each storage once (views share storage). Tensors that exist only in C++
(saved activations inside a graph, gradients never touched from Python) are
not Python objects and so not in the census: on CPU the process RSS is the
measure of everything, on CUDA the allocator's counters.

Cost: about 0.1 µs per object the garbage collector tracks (the scan runs
at C speed: `compress` over `map(type, gc.get_objects())`) plus a few µs per
tensor — 10-20 ms in a process that imported torch (~170k objects) — so the
memory probe runs it on a sparse schedule and records its cost.

`count_graph_nodes` walks `grad_fn.next_functions` from some roots with a
node limit; about 0.7 µs per node.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable
from itertools import compress
from typing import Any

MIB = 2**20


class TensorTypes:
    """`type(obj)` -> is it a tensor? Cached per type; never touches the object itself.

    `isinstance` would call `obj.__class__`, which lazy modules answer by
    importing (and warning); `type()` asks nothing of the object.
    """

    def __init__(self, torch: Any):
        self.base = getattr(torch._C, "TensorBase", torch.Tensor)
        self.parameter = torch.nn.Parameter
        self._cache: dict[type, bool] = {}

    def __call__(self, obj: Any) -> bool:
        t = type(obj)
        hit = self._cache.get(t)
        if hit is None:
            try:
                hit = self._cache[t] = issubclass(t, self.base)
            except TypeError:
                hit = self._cache[t] = False
        return hit

    def all_types(self) -> set[type]:
        """The tensor class and every subclass defined so far (Parameter, FakeTensor, …)."""
        found: set[type] = set()
        todo = [self.base]
        while todo:
            cls = todo.pop()
            if cls in found:
                continue
            found.add(cls)
            try:
                todo.extend(cls.__subclasses__())
            except TypeError:
                pass
        return found


def live_tensors(is_tensor: TensorTypes) -> list[Any]:
    """Every tensor the garbage collector tracks, found at C speed (no Python loop per object)."""
    types = is_tensor.all_types()
    objects = gc.get_objects()
    try:
        return list(compress(objects, map(types.__contains__, map(type, objects))))
    finally:
        del objects


def storage_key_and_bytes(tensor: Any) -> tuple[tuple[str, int], int] | None:
    """((device, data_ptr), nbytes) of a tensor's storage; None for storage-less tensors."""
    try:
        storage = tensor.untyped_storage()
        return (str(tensor.device), storage.data_ptr()), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None  # sparse, meta, fake and other storage-less tensors


def take_census(is_tensor: TensorTypes, top: int = 25) -> dict[str, Any]:
    started = time.perf_counter()
    groups: dict[tuple, list[int]] = {}
    seen: set[tuple[str, int]] = set()
    total = count = with_graph = 0
    tensors = live_tensors(is_tensor)
    try:
        for obj in tensors:
            found = storage_key_and_bytes(obj)
            if found is None:
                continue
            key, nbytes = found
            count += 1
            try:
                graph = obj.grad_fn is not None
                group_key = (tuple(obj.shape), str(obj.dtype).replace("torch.", ""), key[0], graph,
                             type(obj) is is_tensor.parameter)
            except (RuntimeError, AttributeError):
                continue
            with_graph += graph
            new = key[1] != 0 and key not in seen
            if new:
                seen.add(key)
                total += nbytes
            entry = groups.get(group_key)
            if entry is None:
                entry = groups[group_key] = [0, 0]
            entry[0] += 1
            entry[1] += nbytes if new else 0
    finally:
        del tensors
    by_bytes = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))[:top]
    by_count = sorted(groups.items(), key=lambda kv: -kv[1][0])[: max(top // 3, 1)]
    chosen = dict(by_bytes)
    chosen.update(by_count)
    return {
        "tensors": count,
        "mib": round(total / MIB, 3),
        "graph_tensors": with_graph,
        "groups": [
            {
                "shape": list(k[0]),
                "dtype": k[1],
                "device": k[2],
                "graph": k[3],
                "parameter": k[4],
                "count": v[0],
                "mib": round(v[1] / MIB, 4),
            }
            for k, v in sorted(chosen.items(), key=lambda kv: -kv[1][1])
        ],
        "cost_ms": round((time.perf_counter() - started) * 1e3, 3),
    }


def count_graph_nodes(roots: Iterable[Any], limit: int) -> tuple[int, bool]:
    """Autograd nodes reachable from `roots` (grad_fn objects): (count, hit the limit)."""
    seen: set[Any] = set()
    stack = [r for r in roots if r is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if len(seen) >= limit:
            return len(seen), True
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                stack.append(nxt)
    return len(seen), False

"""Thin wrappers shared by several probes, where PyTorch has no hook of its own.

PyTorch calls no hook when a backward pass starts or when the training loop
waits for a batch, so a few functions are wrapped once per process —
whichever probe asks first — and every probe that cares subscribes:

- `torch.autograd.backward` (which `Tensor.backward` calls): the nan probe
  checks the tensor being differentiated (the loss) before the pass; the
  profile probe times the pass inside its window;
- `torch.compile`: the nan probe must know before anything is compiled (its
  temporary global module hooks would otherwise become part of dynamo's
  guards); the compile probe can force a backend (`--compile-backend eager`);
- `DataLoader.__init__` (settings and the user's call site), `__iter__` (ties
  an iterator to its loader) and `_BaseDataLoaderIter.__next__` (time blocked
  waiting for a batch): the data and profile probes read the wait, the nan
  probe the last batch (to tell a non-finite batch from a non-finite model);
  while the nan probe keeps the last batch, `_BaseDataLoaderIter._next_index`
  too: the dataset indices of each batch, kept in the order they were asked
  for (workers deliver in that order), so that a non-finite batch can be
  rebuilt item by item to find the line of the script's dataset that made it.

Each wrapper costs one Python call and two `perf_counter` reads (~1 µs).
A subscriber that raises is switched off, its probe disabled and a
`probe-error` written: the script never sees it.
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.heartbeat import beat
from torchdoctor.probes.transparent import transparent
from torchdoctor.probes.userframes import is_library_file


def _guarded(probe: Probe, where: str, fn: Callable[..., Any], *args: Any) -> Any:
    if not probe.enabled:
        return None
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a probe's bug must never reach the script
        _switch_off(probe, where, exc)
        return None


def _switch_off(probe: Probe, where: str, exc: BaseException) -> None:
    probe.enabled = False
    probe.emit("probe-error", where=where, error=f"{type(exc).__name__}: {exc}"[:500])


def user_site(start: Any = None) -> tuple[str, int, str] | None:
    """(path, line, function) of the innermost frame that is not a library's, torch's or ours."""
    frame = start or sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not is_library_file(path):
            return path, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def outside_own_init(frame: Any, obj: Any, depth: int = 8) -> Any:
    """The frame that constructs `obj`: above the `__init__`s of the script's own subclass (its
    `super().__init__(...)` is not where the object is made; `NoamLR(optimizer, ...)`, `MyLoader(dataset)` are)."""
    found, current = frame, frame
    for _ in range(depth):
        if current is None:
            break
        if current.f_code.co_name == "__init__" and current.f_locals.get("self") is obj:
            found = current.f_back
        current = current.f_back
    return found


# -- backward ---------------------------------------------------------------------------------


class BackwardWatch:
    """Wraps `torch.autograd.backward` once; subscribers see the tensors and the pass's time."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.original = torch.autograd.backward
        self.before: list[tuple[Probe, Callable[[Any], None]]] = []
        self.calls = 0
        self.retain_graph = False  # the backward being started keeps its graph (retain_graph/create_graph)
        self.busy_s = 0.0  # total wall time inside backward passes, for the profile window
        self._depth = 0
        watch = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> None:
            if watch._depth:  # a backward inside a subscriber's own work
                return watch.original(tensors, *args, **kwargs)
            watch._depth += 1
            # Tensor.backward passes (gradient, retain_graph, create_graph) positionally; retain_graph defaults
            # to create_graph. A retained graph will be backpropagated again: several losses of one forward.
            retain = kwargs.get("retain_graph", args[1] if len(args) > 1 else None)
            create = kwargs.get("create_graph", args[2] if len(args) > 2 else False)
            watch.retain_graph = bool(retain if retain is not None else create)
            try:
                for probe, fn in watch.before:  # _guarded, inlined: one frame less per subscriber and backward
                    if probe.enabled:
                        try:
                            fn(tensors)
                        except Exception as exc:  # noqa: BLE001 - a probe's bug must never reach the script
                            _switch_off(probe, "backward", exc)
            finally:
                watch._depth -= 1
            started = time.perf_counter()
            try:
                return watch.original(tensors, *args, **kwargs)
            finally:
                watch.busy_s += time.perf_counter() - started
                watch.calls += 1
                beat()  # training activity, for the hang watchdog

        backward.__wrapped__ = self.original  # type: ignore[attr-defined]
        backward.__doc__ = self.original.__doc__
        torch.autograd.backward = transparent(backward)

    def subscribe(self, probe: Probe, fn: Callable[[Any], None]) -> None:
        self.before.append((probe, fn))


_BACKWARD: BackwardWatch | None = None


def backward_watch(torch: Any) -> BackwardWatch:
    global _BACKWARD
    if _BACKWARD is None:
        _BACKWARD = BackwardWatch(torch)
    return _BACKWARD


# -- torch.compile ------------------------------------------------------------------------------


class CompileWatch:
    """Wraps `torch.compile` once (nn.Module.compile calls it too): who compiles, with what backend."""

    def __init__(self, torch: Any) -> None:
        import functools

        self.original = torch.compile
        self.calls = 0
        self.backend: str | None = None  # forced backend, e.g. "eager"
        self.forced: list[str] = []  # the backends / modes the script asked for, when overridden
        self.on_call: list[tuple[Probe, Callable[[], None]]] = []
        watch = self

        @functools.wraps(self.original)
        def compile(*args: Any, **kwargs: Any) -> Any:
            watch.calls += 1
            for probe, fn in watch.on_call:
                _guarded(probe, "compile", fn)
            if watch.backend is not None and kwargs.get("backend") != watch.backend:
                asked = kwargs.get("backend") or "inductor"
                name = asked if isinstance(asked, str) else getattr(asked, "__name__", "a custom backend")
                if kwargs.get("mode"):
                    name += f" (mode={kwargs['mode']})"
                watch.forced.append(name)
                kwargs = {**kwargs, "backend": watch.backend, "mode": None, "options": None}
            return watch.original(*args, **kwargs)

        torch.compile = transparent(compile)

    def subscribe(self, probe: Probe, fn: Callable[[], None]) -> None:
        self.on_call.append((probe, fn))


_COMPILE: CompileWatch | None = None


def compile_watch(torch: Any) -> CompileWatch:
    global _COMPILE
    if _COMPILE is None:
        _COMPILE = CompileWatch(torch)
    return _COMPILE


# -- DataLoader -----------------------------------------------------------------------------------


@dataclass
class LoaderInfo:
    """One DataLoader as constructed, and how long the loop waited on it."""

    index: int  # 1, 2, … in construction order
    settings: dict[str, Any]
    site: tuple[str, int, str] | None
    wait_s: float = 0.0
    batches: int = 0
    epochs: int = 0
    first_wait_s: float | None = None  # the first batch (worker start-up, prefetch fill)
    extra: dict[str, Any] = field(default_factory=dict)


def loader_settings(loader: Any) -> dict[str, Any]:
    """What matters about a DataLoader's throughput, read from the constructed object."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    dataset = getattr(loader, "dataset", None)
    try:
        length = len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None
    except Exception:  # noqa: BLE001 - an IterableDataset's __len__ may raise
        length = None
    return {
        "num_workers": int(getattr(loader, "num_workers", 0) or 0),
        "batch_size": getattr(loader, "batch_size", None),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "drop_last": bool(getattr(loader, "drop_last", False)),
        "sampler": type(sampler).__name__ if sampler is not None else None,
        "batch_sampler": type(batch_sampler).__name__ if batch_sampler is not None else None,
        "dataset": type(dataset).__name__ if dataset is not None else None,
        "dataset_len": length,
        **_dataset_split(dataset),
        "timeout_s": float(getattr(loader, "timeout", 0) or 0),
        "collate_fn": getattr(getattr(loader, "collate_fn", None), "__name__", None),
        "cpu_count": _cpu_count(),
    }


def _dataset_split(dataset: Any) -> dict[str, Any]:
    """Which split the dataset says it is: a `train` flag (torchvision's `MNIST(train=False)`) or a `split` string
    (`split="val"`), on the dataset or on the one a Subset wraps."""
    found: dict[str, Any] = {}
    for _ in range(2):
        if dataset is None:
            break
        try:
            flag = vars(dataset).get("train") if hasattr(dataset, "__dict__") else None
            split = vars(dataset).get("split") if hasattr(dataset, "__dict__") else None
        except TypeError:
            break
        if isinstance(flag, bool) and "dataset_train" not in found:
            found["dataset_train"] = flag
        if isinstance(split, str) and "dataset_split" not in found:
            found["dataset_split"] = split[:20]
        dataset = getattr(dataset, "dataset", None) if not found else None
    return found


def _cpu_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


class DataWatch:
    """Wraps the DataLoader once: construction, iteration, and the wait for each batch."""

    def __init__(self, torch: Any) -> None:
        from torch.utils.data import dataloader as dl

        self.loaders: list[LoaderInfo] = []  # in construction order
        self.on_loader: list[tuple[Probe, Callable[[Any, LoaderInfo], None]]] = []
        self.wait_s = 0.0  # totals over every loader, monotonic
        self.batches = 0
        self.keep_last = False  # the nan probe asks for the last batch
        self.last_batch: Any = None
        self.last_loader: LoaderInfo | None = None
        self.last_index: int | None = None  # the batch's index within its epoch
        self.last_indices: Any = None  # the dataset indices the sampler gave for that batch (map-style datasets)
        self.last_dataset: Any = None  # a weak reference to the dataset the batch came from
        self.latest: LoaderInfo | None = None  # the loader of the batch handed out last (always kept: one store)
        self._orig_init = dl.DataLoader.__init__
        self._orig_iter = dl.DataLoader.__iter__
        self._orig_next = dl._BaseDataLoaderIter.__next__
        self._orig_next_index = dl._BaseDataLoaderIter._next_index
        watch = self

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            watch._orig_init(loader, *args, **kwargs)
            if getattr(loader, "_torchdoctor_info", None) is None:  # a subclass's __init__ calls ours via super()
                watch._constructed(loader)

        def __iter__(loader: Any) -> Any:
            iterator = watch._orig_iter(loader)
            info = getattr(loader, "_torchdoctor_info", None)
            if info is not None:
                info.epochs += 1
                try:
                    iterator._torchdoctor_loader = info
                except AttributeError:
                    pass
            return iterator

        def __next__(iterator: Any) -> Any:
            started = time.perf_counter()
            batch = watch._orig_next(iterator)
            waited = time.perf_counter() - started
            info = getattr(iterator, "_torchdoctor_loader", None)
            watch.wait_s += waited
            watch.batches += 1
            watch.latest = info
            if info is not None:
                info.wait_s += waited
                info.batches += 1
                if info.first_wait_s is None:
                    info.first_wait_s = waited
            if watch.keep_last:
                watch.last_batch = batch
                watch.last_loader = info
                watch.last_index = getattr(iterator, "_num_yielded", 0) - 1
                asked = iterator.__dict__.get("_torchdoctor_indices")
                watch.last_indices = asked.popleft() if asked else None
                watch.last_dataset = _weak(getattr(iterator, "_dataset", None))
            return batch

        def _next_index(iterator: Any) -> Any:
            index = watch._orig_next_index(iterator)
            if watch.keep_last:
                asked = iterator.__dict__.get("_torchdoctor_indices")
                if asked is None:
                    asked = iterator._torchdoctor_indices = deque(maxlen=256)  # workers prefetch a few batches
                asked.append(index)
            return index

        for fn, orig in ((__init__, self._orig_init), (__iter__, self._orig_iter), (__next__, self._orig_next),
                         (_next_index, self._orig_next_index)):
            transparent(fn)
            fn.__wrapped__ = orig  # type: ignore[attr-defined]
            fn.__doc__ = orig.__doc__
        dl.DataLoader.__init__ = __init__
        dl.DataLoader.__iter__ = __iter__
        dl._BaseDataLoaderIter.__next__ = __next__
        dl._BaseDataLoaderIter._next_index = _next_index

    def _constructed(self, loader: Any) -> None:
        info = LoaderInfo(index=len(self.loaders) + 1, settings=loader_settings(loader), site=user_site(outside_own_init(sys._getframe(2), loader)))
        self.loaders.append(info)
        try:
            loader._torchdoctor_info = info
        except AttributeError:
            pass
        for probe, fn in self.on_loader:
            _guarded(probe, "dataloader", fn, loader, info)

    def subscribe(self, probe: Probe, fn: Callable[[Any, LoaderInfo], None]) -> None:
        self.on_loader.append((probe, fn))


def _weak(obj: Any) -> Any:
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj  # an object without weak references (a slotted class): held while it is the last


_DATA: DataWatch | None = None


def data_watch(torch: Any) -> DataWatch:
    global _DATA
    if _DATA is None:
        _DATA = DataWatch(torch)
    return _DATA


def subclasses_of(cls: type) -> list[type]:
    """Every subclass of `cls` defined so far, at any depth (what a class-level wrapper must also wrap)."""
    out, todo = [], list(cls.__subclasses__())
    while todo:
        c = todo.pop()
        if c not in out:
            out.append(c)
            todo += c.__subclasses__()
    return out

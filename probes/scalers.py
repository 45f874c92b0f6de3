"""The GradScalers the script builds, known to every probe that must tell a scaled loss from the loss itself.

`GradScaler.__init__` is wrapped once (weak references only), and
`GradScaler.step`, to count the steps the scaler attempted (a skipped one
never reaches `optimizer.step()`) and tell subscribers. `scale_of`
recognises the multiplication `GradScaler.scale` adds to the graph: a
`MulBackward0` whose saved factor shares its storage with a scaler's
`_scale` tensor — no device sync, no value read.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from torchdoctor.probes.transparent import transparent


class ScalerWatch:
    def __init__(self, torch: Any) -> None:
        from torch.amp import grad_scaler

        self.scalers: weakref.WeakSet = weakref.WeakSet()
        self.sites: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # where the script built each scaler
        self.stepping: Any = None  # the scaler whose step() is running (an optimizer step hook can ask which)
        self.steps = 0  # scaler.step() calls of enabled scalers
        self.after_step: list[tuple[Any, Callable[[], None]]] = []
        cls = grad_scaler.GradScaler
        original = cls.__init__
        original_step = cls.step
        watch = self

        def __init__(scaler: Any, *args: Any, **kwargs: Any) -> None:
            original(scaler, *args, **kwargs)
            try:
                watch.scalers.add(scaler)
                from torchdoctor.probes.sites import here

                watch.sites[scaler] = here()
            except TypeError:
                pass

        def step(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            watch.stepping = scaler
            try:
                result = original_step(scaler, *args, **kwargs)
            finally:
                watch.stepping = None
            if getattr(scaler, "_enabled", False):
                watch.steps += 1
                for probe, fn in watch.after_step:
                    if probe.enabled:
                        try:
                            fn()
                        except Exception as exc:  # noqa: BLE001 - never reaches the script
                            probe.enabled = False
                            probe.emit("probe-error", where="scaler-step", error=f"{type(exc).__name__}: {exc}"[:500])
            return result

        for fn, orig in ((__init__, original), (step, original_step)):
            transparent(fn)
            fn.__wrapped__ = orig  # type: ignore[attr-defined]
            fn.__doc__ = orig.__doc__
        cls.__init__ = __init__
        cls.step = step

    def subscribe(self, probe: Any, fn: Callable[[], None]) -> None:
        """`fn()` after every step an enabled scaler attempted (skipped or not)."""
        self.after_step.append((probe, fn))

    def enabled(self) -> bool:
        return any(getattr(s, "_enabled", False) for s in list(self.scalers))

    def scale_pointers(self) -> set[int]:
        out = set()
        for scaler in list(self.scalers):
            tensor = getattr(scaler, "_scale", None)
            if tensor is not None:
                out.add(tensor.data_ptr())
        return out

    def scale_of(self, root: Any) -> Any:
        """The scale tensor if `root` is `GradScaler.scale(loss)`'s output, else None."""
        if not len(self.scalers):
            return None
        node = getattr(root, "grad_fn", None)
        if node is None or node.name() != "MulBackward0":
            return None
        other = getattr(node, "_saved_other", None)
        if other is not None and other.numel() == 1 and other.data_ptr() in self.scale_pointers():
            return other
        return None


_WATCH: ScalerWatch | None = None


def scaler_watch(torch: Any) -> ScalerWatch:
    global _WATCH
    if _WATCH is None:
        _WATCH = ScalerWatch(torch)
    return _WATCH

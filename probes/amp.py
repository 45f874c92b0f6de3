"""The amp probe: autocast regions as entered, and how the GradScaler is (or is not) used around them.

Measures
--------
- every `torch.autocast` region entered (`autocast.__enter__` is wrapped):
  device, dtype, enabled, how often, and the user's line of the first one
  of each kind. Regions entered with grad disabled (evaluation) are counted
  but do not arm the checks below;
- each backward (`torch.autograd.backward`, shared wrapper in
  probes/patches.py): whether a float16 region was entered since the last
  backward and the tensor being differentiated is not the output of
  `GradScaler.scale` — a float16 backward without loss scaling. On the
  first one, the share of gradient entries that are exactly zero is
  measured once at the next optimizer step;
- `GradScaler.scale`, `unscale_`, `step` and `update` (wrapped): whether the
  gradients are still scaled when `clip_grad_norm_` / `clip_grad_value_`
  run (both wrapped), with the scale and the norm clip saw; whether a
  scaler is used although every autocast region so far was bfloat16; each
  `scaler.step` that skipped `optimizer.step()` (seen by a global optimizer
  pre-hook, no device sync); the scale after `update()` — read every update
  when it lives on the CPU, on CUDA only after a skipped step and every
  `scale_read_every` updates (one small device-to-host copy).

Costs: ~1 µs per autocast region entered, < 1 µs per backward, ~2 µs per
scaler call; nothing per step for a script without autocast or a scaler.

Symptoms (thresholds in rules/data/thresholds.toml, [amp]; classified in
doctor/analysis/amp.py)
--------------------------------------------------------------------------
- fp16-without-scaler: a backward after a float16 autocast region, on a
  tensor no GradScaler scaled;
- clip-before-unscale: clipping while the gradients were still multiplied
  by the scale (no `scaler.unscale_(optimizer)` since `scaler.scale`);
- scaler-with-bf16: `scaler.scale` with only bfloat16 autocast regions seen;
- loss-scale-collapse: the scale fell below `collapse_scale`, or
  `collapse_consecutive_skips` skipped steps in a row, or more than
  `collapse_skipped_fraction` of at least `collapse_min_attempts` steps
  skipped. When the nan probe runs too, it raises this one and the amp
  probe only adds the scale's history.
"""

from __future__ import annotations

import weakref
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.patches import backward_watch
from torchdoctor.probes.sites import here
from torchdoctor.probes.transparent import transparent

MAX_CHANGES = 200


class AmpProbe(Probe):
    name = "amp"

    def install(self) -> None:
        import torch
        from torch.amp import autocast_mode, grad_scaler

        self.torch = torch
        opt = self.options
        self.scale_read_every = int(opt.get("scale_read_every", 100))
        self.max_events = int(opt.get("max_events", 30))
        self.events = 0
        self.regions: dict[tuple[str, str, bool], int] = {}
        self.fp16_regions = 0
        self.bf16_regions = 0
        self.fp16_pending = False
        self.fp16_unscaled = 0
        self.measure_zeros = False
        self.scaled: list[weakref.ref] = []
        self.last_scaler: weakref.ref | None = None
        self.grads_scaled = False
        self.unscaled = False
        self.clip_scaled = 0
        self.bf16_scaled = 0
        self.attempts = 0
        self.skipped = 0
        self.streak = 0
        self.max_streak = 0
        self.first_success: int | None = None
        self.scale: float | None = None
        self.scale_min: float | None = None
        self.changes: list[tuple[int, float]] = []
        self.next_progress = 1
        self._opt_ran = False
        self._pre_handle: Any = None
        self._float16 = torch.float16
        self._bfloat16 = torch.bfloat16

        autocast = autocast_mode.autocast
        autocast.__enter__ = self._wrap_enter(autocast.__enter__)
        scaler = grad_scaler.GradScaler
        scaler.scale = self._wrap_scale(scaler.scale)
        scaler.unscale_ = self._wrap_unscale(scaler.unscale_)
        scaler.step = self._wrap_step(scaler.step)
        scaler.update = self._wrap_update(scaler.update)
        from torch.nn.utils import clip_grad

        for name in ("clip_grad_norm_", "clip_grad_value_"):
            original = getattr(clip_grad, name)
            wrapped = self._wrap_clip(original, name)
            setattr(clip_grad, name, wrapped)
            if getattr(torch.nn.utils, name, None) is original:
                setattr(torch.nn.utils, name, wrapped)
        backward_watch(torch).subscribe(self, self._backward)

    # -- helpers ------------------------------------------------------------------------------------

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.events < self.max_events:
            self.events += 1
            self.emit(kind, **fields)

    def _guard(self, fn: Any, *args: Any) -> Any:
        if not self.enabled:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - never reaches the script
            self.enabled = False
            self.emit("probe-error", where=getattr(fn, "__name__", "amp"), error=f"{type(exc).__name__}: {exc}"[:500])
            return None

    # -- autocast ---------------------------------------------------------------------------------

    def _wrap_enter(self, original: Any) -> Any:
        probe = self

        def __enter__(ac: Any) -> Any:
            result = original(ac)
            probe._guard(probe._entered, ac)
            return result

        __enter__.__wrapped__ = original  # type: ignore[attr-defined]
        return transparent(__enter__)

    def _entered(self, ac: Any) -> None:
        dtype = getattr(ac, "fast_dtype", None)
        enabled = bool(getattr(ac, "_enabled", True))
        key = (str(getattr(ac, "device", "?")), str(dtype).replace("torch.", ""), enabled)
        n = self.regions.get(key, 0)
        self.regions[key] = n + 1
        if n == 0:
            self._emit("autocast", device=key[0], dtype=key[1], enabled=enabled, site=here(),
                       grad=self.torch.is_grad_enabled())
        if not enabled or not self.torch.is_grad_enabled():
            return
        if dtype == self._float16:
            self.fp16_regions += 1
            self.fp16_pending = True
        elif dtype == self._bfloat16:
            self.bf16_regions += 1

    # -- backward ---------------------------------------------------------------------------------

    def _backward(self, tensors: Any) -> None:
        if not self.fp16_pending:
            return
        self.fp16_pending = False
        roots = [tensors] if isinstance(tensors, self.torch.Tensor) else list(tensors or ())[:4]
        scaled = {id(t) for t in (ref() for ref in self.scaled) if t is not None}
        if any(id(t) in scaled for t in roots):
            return
        self.fp16_unscaled += 1
        if self.fp16_unscaled == 1:
            self.measure_zeros = True
        if self.fp16_unscaled <= 3:
            self._emit("fp16-backward", count=self.fp16_unscaled, site=here(),
                       at_step=self.step)

    def before_step(self, step: int, optimizer: Any) -> None:
        if not self.measure_zeros:
            return
        self.measure_zeros = False
        zeros = total = 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is not None:
                    zeros += int((g == 0).sum())
                    total += g.numel()
        if total:
            self.emit("fp16-zeros", zero_grad_fraction=round(zeros / total, 4), elements=total, at_step=step)

    # -- GradScaler ---------------------------------------------------------------------------------

    def _wrap_scale(self, original: Any) -> Any:
        probe = self

        def scale(scaler: Any, outputs: Any) -> Any:
            result = original(scaler, outputs)
            probe._guard(probe._scaled, scaler, result)
            return result

        scale.__wrapped__ = original  # type: ignore[attr-defined]
        return transparent(scale)

    def _scaled(self, scaler: Any, result: Any) -> None:
        if not getattr(scaler, "_enabled", False):
            return
        self.last_scaler = weakref.ref(scaler)
        tensors = [result] if isinstance(result, self.torch.Tensor) else [
            t for t in (list(result)[:4] if isinstance(result, (list, tuple)) else []) if isinstance(t, self.torch.Tensor)
        ]
        self.scaled = [weakref.ref(t) for t in tensors]
        self.grads_scaled = True
        self.unscaled = False
        if self.bf16_regions and not self.fp16_regions:
            self.bf16_scaled += 1
            if self.bf16_scaled == 1:
                self._emit("scaler-bf16", site=here(), at_step=self.step,
                           bf16_regions=self.bf16_regions)

    def _wrap_unscale(self, original: Any) -> Any:
        probe = self

        def unscale_(scaler: Any, optimizer: Any) -> None:
            original(scaler, optimizer)
            probe.unscaled = True

        unscale_.__wrapped__ = original  # type: ignore[attr-defined]
        return transparent(unscale_)

    def _wrap_step(self, original: Any) -> Any:
        probe = self

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(scaler, "_enabled", False) or not probe.enabled:
                return original(scaler, optimizer, *args, **kwargs)
            if probe._pre_handle is None:
                probe._guard(probe._hook_optimizers)
            probe._opt_ran = False
            result = original(scaler, optimizer, *args, **kwargs)
            probe._guard(probe._stepped, probe._opt_ran)
            return result

        step.__wrapped__ = original  # type: ignore[attr-defined]
        return transparent(step)

    def _hook_optimizers(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def ran(optimizer: Any, args: Any, kwargs: Any) -> None:
            self._opt_ran = True

        self._pre_handle = register_optimizer_step_pre_hook(ran)

    def _stepped(self, ran: bool) -> None:
        self.attempts += 1
        self.grads_scaled = False
        self.unscaled = False
        if ran:
            self.streak = 0
            if self.first_success is None:
                self.first_success = self.attempts
        else:
            self.skipped += 1
            self.streak += 1
            self.max_streak = max(self.max_streak, self.streak)
        if self.attempts >= self.next_progress:  # 1, 2, 4, …: a crash keeps recent numbers
            self.next_progress *= 2
            self._progress("scaler-progress")

    def _progress(self, kind: str) -> None:
        self.emit(kind, attempts=self.attempts, skipped=self.skipped, streak=self.streak, max_streak=self.max_streak,
                  first_success=self.first_success, scale=self.scale, scale_min=self.scale_min)

    def _wrap_update(self, original: Any) -> Any:
        probe = self

        def update(scaler: Any, new_scale: Any = None) -> None:
            original(scaler, new_scale)
            if getattr(scaler, "_enabled", False):
                probe._guard(probe._updated, scaler)

        update.__wrapped__ = original  # type: ignore[attr-defined]
        return transparent(update)

    def _updated(self, scaler: Any) -> None:
        self.grads_scaled = False
        self.unscaled = False
        tensor = getattr(scaler, "_scale", None)
        if tensor is None:
            return
        if tensor.device.type != "cpu" and self.streak == 0 and self.attempts % self.scale_read_every:
            return  # CUDA: read only after a skipped step and every `scale_read_every` updates
        value = float(tensor)
        if value != self.scale:
            self.scale = value
            self.scale_min = value if self.scale_min is None else min(self.scale_min, value)
            if len(self.changes) < MAX_CHANGES:
                self.changes.append((self.attempts, value))

    def _read_scale(self) -> float | None:
        scaler = self.last_scaler() if self.last_scaler is not None else None
        tensor = getattr(scaler, "_scale", None) if scaler is not None else None
        return float(tensor) if tensor is not None else None

    # -- clipping -----------------------------------------------------------------------------------

    def _wrap_clip(self, original: Any, name: str) -> Any:
        probe = self

        def clip(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if probe.grads_scaled and not probe.unscaled and probe.enabled:
                probe._guard(probe._clipped_scaled, name, args, kwargs, result)
            return result

        clip.__wrapped__ = original  # type: ignore[attr-defined]
        clip.__name__ = name
        clip.__doc__ = original.__doc__
        return transparent(clip)

    def _clipped_scaled(self, name: str, args: Any, kwargs: Any, result: Any) -> None:
        self.clip_scaled += 1
        if self.clip_scaled > 3:
            return
        limit = kwargs.get("max_norm", kwargs.get("clip_value", args[1] if len(args) > 1 else None))
        fields: dict[str, Any] = {"function": name, "count": self.clip_scaled, "at_step": self.step,
                                  "site": here(), "scale": self._read_scale()}
        if isinstance(limit, (int, float)):
            fields["max_norm" if name == "clip_grad_norm_" else "clip_value"] = float(limit)
        if isinstance(result, self.torch.Tensor) and result.numel() == 1:
            fields["clipped_norm"] = float(result)
        self._emit("clip-scaled", **fields)

    # -- the end ------------------------------------------------------------------------------------

    def finish(self, reason: str) -> None:
        if self.last_scaler is not None and self.scale is None:
            self.scale = self._read_scale()
        self.emit(
            "amp-summary",
            regions=[{"device": d, "dtype": t, "enabled": e, "count": n} for (d, t, e), n in self.regions.items()],
            fp16_regions=self.fp16_regions,
            bf16_regions=self.bf16_regions,
            fp16_unscaled_backwards=self.fp16_unscaled,
            clip_scaled=self.clip_scaled,
            bf16_scaled=self.bf16_scaled,
            scaler=self.last_scaler is not None,
            attempts=self.attempts,
            skipped=self.skipped,
            max_streak=self.max_streak,
            first_success=self.first_success,
            scale=self.scale,
            scale_min=self.scale_min,
            scale_changes=self.changes,
        )


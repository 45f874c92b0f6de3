"""The data probe: every DataLoader as constructed, and how long each step waits for its batches.

Measures
--------
- each `torch.utils.data.DataLoader` when it is constructed: num_workers,
  batch_size, pin_memory, persistent_workers, prefetch_factor, drop_last,
  the sampler / batch sampler / dataset classes, the dataset's length, the
  timeout, the CPUs this process may use, and the user's line that built it
  (probes/patches.py wraps `DataLoader.__init__`);
- per optimizer step: the wall time the loop spent blocked in the loader
  iterator's `__next__` (the data wait) and the number of batches it took;
  per loader: total wait, batches, epochs, and the first batch's wait
  (worker start-up, kept apart from the steady state).

- which loader each optimizer step trained on: at a primary optimizer step
  that followed a backward since the latest batch, that batch's loader
  counts one stepped batch; the user's call stack of the first backward on each
  loader's batches. With the dataset's own split (`train` flag, `split`
  string) and the loader's construction line, the analysis tells a
  validation/test loader the optimizer steps on (backward-in-validation,
  doctor/analysis/validation.py).

Cost: one wrapper call per batch (~1 µs: two `perf_counter` reads) and a
dictionary per step; an integer store per backward, a stack walk for the
first backward of each loader; nothing per sample.

Symptom (thresholds in rules/data/thresholds.toml, [data]; classified in
doctor/analysis/data.py)
-----------------------------------------------------------------------
- dataloader-bound: after `warmup_steps`, the data wait is at least
  `wait_fraction` of the step time and at least `min_wait_ms` per step, over
  at least `min_steps` steps; located at the DataLoader's construction line,
  with its settings and suggested ones.
"""

from __future__ import annotations

import sys
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.patches import LoaderInfo, backward_watch, data_watch
from torchdoctor.probes.sites import user_stack


class DataProbe(Probe):
    name = "data"

    def install(self) -> None:
        import torch

        self.watch = data_watch(torch)
        self.watch.subscribe(self, self._constructed)
        self._wait_s = self.watch.wait_s
        self._batches = self.watch.batches
        self._loader_wait: dict[int, float] = {}
        # the batch count at the latest backward, and at the latest step counted for a loader (one per batch)
        self._backward_at = -1
        self._stepped_at = -1
        # Loaders with workers built since the last step, with the user's stack that built them: at the next step,
        # the frame both stacks share (the training loop's) tells which of its lines built the loader.
        self._built: list[tuple[LoaderInfo, list[tuple[int, Any, int]]]] = []
        self._callers_left = 16
        backward_watch(torch).subscribe(self, self._backward)

    def _backward(self, tensors: Any) -> None:
        watch = self.watch
        self._backward_at = watch.batches
        info = watch.latest
        if info is not None and "backward_stack" not in info.extra:
            info.extra["backward_stack"] = _user_stack(sys._getframe(1))

    def _constructed(self, loader: Any, info: LoaderInfo) -> None:
        event: dict[str, Any] = {"index": info.index, **info.settings}
        if info.site is not None:
            event["path"], event["line"], event["function"] = info.site
            # a loader built in a factory function is named by its caller (`val_dl = make_loader(...)`)
            event["callers"] = _user_stack(sys._getframe(1))[-3:-1]
        self.emit("dataloader", **event)
        if info.site is not None and int(info.settings.get("num_workers") or 0) > 0 and self._callers_left > 0 \
                and len(self._built) < 8:
            self._built.append((info, user_stack(sys._getframe(1))))

    def _loop_callers(self) -> None:
        """For loaders built since the last step: when the training loop's frame (the deepest frame the building
        stack shares with this step's) built the loader through a call of its own (a `get_loader()` factory, a
        data module's method), that call's line, where the construction is repeated every epoch."""
        built, self._built = self._built, []
        stepping = {(key, code) for key, code, _ in user_stack(sys._getframe(2), limit=64)}
        for info, stack in built:
            shared = [(code, line) for key, code, line in stack if (key, code) in stepping]
            if not shared or info.site is None:
                continue
            code, line = shared[-1]
            if (code.co_filename, line) == tuple(info.site[:2]):
                continue  # built inline in the loop
            self._callers_left -= 1
            self.emit("dataloader-caller", index=info.index, path=code.co_filename, line=line,
                      function=code.co_name)

    def after_step(self, step: int, optimizer: Any) -> dict[str, Any] | None:
        if self._built:
            self._loop_callers()
        watch = self.watch
        latest = watch.latest
        if latest is not None and self._backward_at == watch.batches and self._stepped_at != watch.batches:
            self._stepped_at = watch.batches
            latest.extra["stepped"] = latest.extra.get("stepped", 0) + 1
        if watch.batches == self._batches and not watch.loaders:
            return None
        waited = watch.wait_s - self._wait_s
        record: dict[str, Any] = {"wait_ms": round(waited * 1e3, 3), "batches": watch.batches - self._batches}
        self._wait_s, self._batches = watch.wait_s, watch.batches
        if len(watch.loaders) > 1:  # which loader the step waited on
            busiest, most = None, 0.0
            for info in watch.loaders:
                delta = info.wait_s - self._loader_wait.get(info.index, 0.0)
                self._loader_wait[info.index] = info.wait_s
                if delta > most:
                    busiest, most = info.index, delta
            if busiest is not None:
                record["loader"] = busiest
        elif watch.loaders:
            record["loader"] = watch.loaders[0].index
        return record

    def finish(self, reason: str) -> None:
        for info in self.watch.loaders:
            self.emit(
                "dataloader-total",
                index=info.index,
                wait_ms=round(info.wait_s * 1e3, 3),
                batches=info.batches,
                epochs=info.epochs,
                first_wait_ms=None if info.first_wait_s is None else round(info.first_wait_s * 1e3, 3),
                stepped=info.extra.get("stepped", 0),
                backward_stack=info.extra.get("backward_stack"),
            )


def _user_stack(frame: Any) -> list[dict[str, Any]]:
    """The user's frames (outermost first, at most 16) of a backward: where the analysis tells the evaluation's
    call from the training's when both reach one shared backward line."""
    return [{"path": code.co_filename, "line": line, "function": code.co_name}
            for _, code, line in user_stack(frame, limit=16)]

"""The memory probe: what memory the run holds, step by step, and who holds it.

Measures
--------
- every step: the process RSS (read from /proc/self/statm; after the dense
  phase, on steps so short that the read would cost more than
  `per_step_fraction` of them, every few steps instead); when the script
  uses CUDA, the caching allocator's allocated, reserved and peak bytes
  (`torch.cuda.memory_stats_as_nested_dict`);
- holders (probes/holders.py): at the optimizer step, the user's frames are
  scanned for names holding graph-carrying tensors, big tensors or lists of
  tensors, with a bounded walk of each graph — every step for the first
  `dense_steps` steps, then spaced so its cost stays under `budget_fraction`
  of the step time (and at most ~64 scans per doubling of the step count);
- a census of live tensors (probes/census.py) by shape, dtype, device and
  whether they hold a graph — at the `dense_census_steps` (after warm-up, in
  the middle and at the end of the dense phase), later whenever RSS / CUDA
  allocated memory grew by `census_trigger_mib` (within the same budget),
  and once at the end;
- a peak breakdown on one step (`breakdown_step` + 1): parameters, gradients
  and optimizer state from the optimizer's tensors, activations as the bytes
  saved for backward (a `saved_tensors_hooks` pack hook that returns the
  tensor unchanged), the batch size as the first dimension of the first
  module input of that step; on CUDA also the allocator's peak;
- an OOM (torch.OutOfMemoryError, MemoryError, the CPU allocator's "can't
  allocate memory"): the allocator's statistics and, on CUDA, a memory
  snapshot;
- on CUDA: the allocator's history (`_record_memory_history`, queued to
  start the moment CUDA initialises, never initialising CUDA itself), dumped
  with `_dump_snapshot` on OOM and at the end (artifact `memory_snapshot`,
  open it at https://pytorch.org/memory_viz).
Without CUDA the instrument degrades to RSS and the census, and says so.

Costs (bench/bench_run.py, CPU)
-------------------------------
5-40 µs per step for RSS (a /proc read; the higher figure on a busy machine,
right after a training step has evicted the caches) plus ~20 µs for the CUDA
counters when CUDA is used; the holder scan costs ~0.7 µs per autograd node walked; a census
10-50 ms (0.1-0.2 µs per object the garbage collector tracks). After the dense phase the sparse
work is scheduled to stay under `budget_fraction` (0.3%) of the measured step
time, and RSS under `per_step_fraction` (0.2%); its own time is recorded in
the `memory-cost` event.

Symptoms (thresholds in rules/data/thresholds.toml, [memory]; classified in
doctor/analysis/memory.py)
---------------------------------------------------------------------------
- memory-growth: a robust (Theil–Sen) slope of RSS / CUDA allocated memory
  over the steps after `warmup_steps` of at least `min_slope_mib_per_step`,
  at least `min_growth_mib` in total, still growing over the last half of
  the window (`sustained_fraction`); or a holder whose graph grows by at
  least `min_graph_nodes_per_step` nodes per step (`min_graph_growth_nodes`
  in total), or a container of graph-carrying tensors growing by
  `min_container_tensors_per_step`.
- high-memory: the peak (CUDA: measured; CPU: parameters + gradients +
  optimizer state + activations) above `near_budget_fraction` of
  --gpu-memory (error when above the budget itself) or of the device's
  memory.
- oom: an out-of-memory error, with the allocator's numbers.
- fragmentation: reserved-but-unallocated above `fragmentation_fraction` of
  reserved and `fragmentation_min_gib`, at an OOM, or peak reserved vs peak allocated at the end (CUDA).
- host-oom: killed by SIGKILL with RSS above `host_oom_rss_fraction` of the
  machine's (or cgroup's) memory.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from array import array
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.census import MIB, TensorTypes, storage_key_and_bytes, take_census
from torchdoctor.probes.holders import HolderScan


def ram_limit_bytes() -> int | None:
    """The memory this process may use: the machine's RAM, or a smaller cgroup limit."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                raw = fh.read().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 2**60:
            limits.append(int(raw))
    return min(limits) if limits else None


class _Rss:
    """Resident set size from /proc/self/statm (1-2 µs) or getrusage's peak elsewhere."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self.fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self.fd = None

    def mib(self) -> float:
        if self.fd is not None:
            try:
                return round(int(os.pread(self.fd, 128, 0).split()[1]) * self.page / MIB, 2)
            except (OSError, ValueError, IndexError):
                pass
        return peak_rss_mib()


def peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (MIB if sys.platform == "darwin" else 1024), 2)  # bytes on macOS, KiB on Linux


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return "can't allocate memory" in text or "out of memory" in text.lower()


class MemoryProbe(Probe):
    name = "memory"

    def install(self) -> None:
        import torch

        self.torch = torch
        opt = self.options
        self.dense_steps = int(opt.get("dense_steps", 40))
        self.dense_census_steps = {int(s) for s in opt.get("dense_census_steps", (5, 20, 40))}
        self.budget = float(opt.get("budget_fraction", 0.003))
        self.per_step_fraction = float(opt.get("per_step_fraction", 0.002))
        self._rss_every = 1
        self.census_trigger = float(opt.get("census_trigger_mib", 32.0))
        self.census_top = int(opt.get("census_top", 25))
        self.history_entries = int(opt.get("history_max_entries", 100_000))
        breakdown = int(opt.get("breakdown_step", 2))
        limit = self.session.steps_limit
        self.breakdown_step = min(breakdown, limit - 1) if limit else breakdown  # so --steps N still sees it
        self.rss = _Rss()
        self.is_tensor = TensorTypes(torch)
        self.holders = HolderScan(
            self.is_tensor, int(opt.get("graph_walk_limit", 100_000)), int(opt.get("container_sample", 8))
        )
        self.cuda_used = False
        self.history = False
        self.snapshot_path: str | None = None
        self.optimizers: list[Any] = []
        self._last_t: float | None = None
        self._step_s = 0.0  # moving average of the wall time between steps
        self._next_scan = 1
        self._next_census_allowed = 0
        self._census_level: float | None = None
        self._census_done_at = -1
        self._sampling: dict[str, Any] | None = None
        self.cost = {"per_step_s": 0.0, "steps": 0, "scan_s": 0.0, "scans": 0, "census_s": 0.0, "censuses": 0}
        self._recent = array("d", [0.0] * 1024)  # the last per-step costs: their median ignores preemptions
        self._filled = 0
        lazy_call = getattr(torch.cuda, "_lazy_call", None)
        if self.history_entries > 0 and lazy_call is not None:
            lazy_call(self._start_history)  # runs when (if) the script initialises CUDA
        self.emit("memory-start", ram_limit_mib=_mib_or_none(ram_limit_bytes()), rss_mib=self.rss.mib())

    # -- CUDA (thin: every number it produces is classified in the parent) ------------

    def _start_history(self) -> None:
        try:
            self.torch.cuda.memory._record_memory_history(max_entries=self.history_entries)
            self.history = True
        except Exception as exc:  # noqa: BLE001 - no history: the stats still work
            self.note(f"CUDA allocator history unavailable ({type(exc).__name__}: {exc}); no memory snapshot.")

    def _cuda_now(self) -> dict[str, float] | None:
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return None
        self.cuda_used = True
        stats = cuda.memory_stats_as_nested_dict()
        if not stats:
            return None
        return {
            "cuda_allocated_mib": round(stats["allocated_bytes"]["all"]["current"] / MIB, 2),
            "cuda_reserved_mib": round(stats["reserved_bytes"]["all"]["current"] / MIB, 2),
            "cuda_peak_mib": round(stats["allocated_bytes"]["all"]["peak"] / MIB, 2),
        }

    def _dump_snapshot(self, why: str) -> None:
        if not self.history:
            return
        path = self.artifact_path("memory_snapshot.pickle")
        try:
            self.torch.cuda.memory._dump_snapshot(path)
        except Exception as exc:  # noqa: BLE001
            self.note(f"could not dump the CUDA memory snapshot ({why}): {type(exc).__name__}: {exc}")
            return
        self.snapshot_path = path
        self.artifact("memory_snapshot", path)

    def _cuda_stats_flat(self) -> dict[str, Any]:
        try:
            stats = self.torch.cuda.memory_stats()
            total = self.torch.cuda.get_device_properties(self.torch.cuda.current_device()).total_memory
        except Exception:  # noqa: BLE001
            return {}
        keep = ("allocated_bytes.all", "reserved_bytes.all", "active_bytes.all", "inactive_split_bytes.all",
                "requested_bytes.all", "num_ooms", "num_alloc_retries", "max_split_size")
        flat = {k: v for k, v in stats.items() if k.startswith(keep)}
        flat["device_total_bytes"] = total
        return flat

    # -- per step ------------------------------------------------------------------

    def after_step(self, step: int, optimizer: Any) -> dict[str, Any]:
        started = time.perf_counter()
        if self._last_t is not None:
            dt = started - self._last_t
            self._step_s = dt if self._step_s == 0.0 else 0.9 * self._step_s + 0.1 * dt
        self._last_t = started
        if not any(o is optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)
        record: dict[str, Any] = {}
        if step <= self.dense_steps or step % self._rss_every == 0:
            record["rss_mib"] = self.rss.mib()
        cuda = self._cuda_now()
        if cuda:
            record.update(cuda)
        if step > 1:  # the first step pays one-off costs (lazy imports); the steady state is what matters
            spent = time.perf_counter() - started
            self.cost["per_step_s"] += spent
            self.cost["steps"] += 1
            self._recent[self._filled % len(self._recent)] = spent
            self._filled += 1
            if step == self.dense_steps and self._step_s > 0:
                # Reading RSS costs a syscall (5-40 µs): on steps so short that this is over
                # `per_step_fraction` of them, read it every few steps instead.
                self._rss_every = max(1, math.ceil(self._typical_cost() / (self.per_step_fraction * self._step_s)))

        if self._sampling is not None and step > self._sampling["step"]:
            self._end_breakdown(step)
        if step == self.breakdown_step and self._sampling is None:
            self._begin_breakdown(step)
        if step >= self._next_scan:
            self._scan(step)
        level = record.get("cuda_allocated_mib", record.get("rss_mib"))
        if level is not None and self._census_due(step, level):
            self._census(step, level)
        self._last_t += time.perf_counter() - started  # our own time is not step time
        return record

    def _typical_cost(self) -> float:
        """The median of the recent per-step costs (seconds)."""
        n = min(self._filled, len(self._recent))
        return sorted(self._recent[:n])[n // 2] if n else 0.0

    def _spacing(self, cost_s: float) -> int:
        if self._step_s <= 0:
            return 1
        return max(1, math.ceil(cost_s / (self.budget * self._step_s)))

    def _scan(self, step: int) -> None:
        started = time.perf_counter()
        frames = self.user_frames(sys._getframe(1))
        try:
            holders = self.holders.scan(frames, self.session.holder_owners())
        finally:
            del frames
        cost = time.perf_counter() - started
        if holders:
            self.emit("holders", holders=holders, cost_ms=round(cost * 1e3, 3))
            cost = time.perf_counter() - started  # the event's write is part of what a scan costs the step
        self.cost["scan_s"] += cost
        self.cost["scans"] += 1
        # After the dense phase: within the time budget, and at most ~64 scans per doubling of the
        # step count, so a million-step run keeps a few hundred samples, not a few hundred thousand.
        self._next_scan = step + 1 if step < self.dense_steps else step + max(self._spacing(cost), step // 64)

    def _census_due(self, step: int, level: float) -> bool:
        if step <= self.dense_steps:
            return step in self.dense_census_steps
        if step < self._next_census_allowed or self._census_level is None:
            return False
        return level - self._census_level >= self.census_trigger

    def _census(self, step: int, level: float | None) -> None:
        result = take_census(self.is_tensor, self.census_top)
        self.cost["census_s"] += result["cost_ms"] / 1e3
        self.cost["censuses"] += 1
        self.emit("census", **result)
        self._census_done_at = step
        if level is not None:
            self._census_level = level
        self._next_census_allowed = step + self._spacing(result["cost_ms"] / 1e3)

    # -- peak breakdown on one step -------------------------------------------------------

    def _begin_breakdown(self, step: int) -> None:
        torch = self.torch
        params = self._storages(p for o in self.optimizers for g in o.param_groups for p in g["params"])
        sampling: dict[str, Any] = {"step": step, "saved": {}, "batch": None, "params": params, "pushed": False}
        self._sampling = sampling
        reason = self._activation_blocker()
        if reason:
            sampling["skipped"] = reason
            return

        def pack(t: Any) -> Any:
            found = storage_key_and_bytes(t)
            if found is not None and found[0] not in params:
                sampling["saved"][found[0]] = found[1]
            return t

        def unpack(t: Any) -> Any:
            return t

        def first_input(module: Any, args: Any) -> None:
            if sampling["batch"] is None:
                for a in args:
                    if self.is_tensor(a) and a.dim() > 0:
                        sampling["batch"] = int(a.shape[0])
                        break
                handle = sampling.pop("pre_hook", None)
                if handle is not None:
                    handle.remove()

        try:
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
        except RuntimeError as exc:  # hooks disabled by the script or a library
            sampling["skipped"] = f"saved-tensor hooks are disabled here ({exc})"
            return
        sampling["pushed"] = True
        sampling["pre_hook"] = torch.nn.modules.module.register_module_forward_pre_hook(first_input)

    def _activation_blocker(self) -> str | None:
        torch = self.torch
        try:
            if torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
                return "the script uses its own saved-tensor hooks (e.g. save_on_cpu or checkpointing)"
        except (AttributeError, RuntimeError):
            return "this torch has no saved-tensor hook API"
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:
            try:
                from torch._dynamo.utils import counters

                if counters["stats"]["unique_graphs"]:
                    return "the model is compiled with torch.compile"
            except Exception:  # noqa: BLE001
                return "torch.compile is loaded"
        return None

    def _stop_sampling(self) -> dict[str, Any] | None:
        sampling, self._sampling = self._sampling, None
        if sampling is None:
            return None
        handle = sampling.pop("pre_hook", None)
        if handle is not None:
            handle.remove()
        if sampling.get("pushed"):
            try:
                self.torch._C._autograd._pop_saved_tensors_default_hooks()
            except RuntimeError:
                pass
        return sampling

    def _end_breakdown(self, step: int | None) -> None:
        sampling = self._stop_sampling()
        if sampling is None:
            return
        params = sampling["params"]
        grads = self._storages(
            p.grad for o in self.optimizers for g in o.param_groups for p in g["params"] if p.grad is not None
        )
        state = self._storages(
            v for o in self.optimizers for s in o.state.values() if isinstance(s, dict) for v in s.values()
            if self.is_tensor(v)
        )
        event: dict[str, Any] = {
            "sampled_step": step,
            "parameters_mib": _mib(sum(params.values())),
            "gradients_mib": _mib(sum(grads.values())),
            "optimizer_state_mib": _mib(sum(state.values())),
            "activations_mib": None if sampling.get("skipped") or step is None else _mib(sum(sampling["saved"].values())),
            "batch_size": sampling["batch"],
            "device": self._device(params),
        }
        if sampling.get("skipped"):
            event["activations_skipped"] = sampling["skipped"]
        if self.cuda_used:
            event["cuda_peak_mib"] = _mib(self.torch.cuda.max_memory_allocated())
            event["device_total_mib"] = _mib(self._cuda_stats_flat().get("device_total_bytes"))
        self.emit("breakdown", **event)

    def _storages(self, tensors: Any) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for t in tensors:
            found = storage_key_and_bytes(t)
            if found is not None:
                out[found[0]] = found[1]
        return out

    @staticmethod
    def _device(params: dict[tuple[str, int], int]) -> str:
        devices = {key[0] for key in params}
        return devices.pop() if len(devices) == 1 else ",".join(sorted(devices)) or "cpu"

    # -- the end --------------------------------------------------------------------

    def on_exception(self, exc: BaseException) -> None:
        if not _is_oom(exc):
            return
        event: dict[str, Any] = {
            "error_type": type(exc).__name__,
            "rss_mib": self.rss.mib(),
            "peak_rss_mib": peak_rss_mib(),
        }
        if self.cuda_used or self.torch.cuda.is_initialized():
            event["cuda"] = self._cuda_stats_flat()
        self.emit("oom", **event)
        self._dump_snapshot("at the OOM")

    def finish(self, reason: str) -> None:
        self._stop_sampling()
        if self._census_done_at != self.step and reason != "terminated":
            self._census(self.step, None)
        summary: dict[str, Any] = {
            "reason": reason,
            "peak_rss_mib": peak_rss_mib(),
            "rss_mib": self.rss.mib(),
            "cuda_used": self.cuda_used,
        }
        if self.cuda_used:
            summary["cuda"] = self._cuda_stats_flat()
            if self.snapshot_path is None:
                self._dump_snapshot("at the end")
        else:
            self.note("CUDA was not used: memory is measured as process RSS and a census of live tensors "
                      "instead of the CUDA allocator's counters and snapshot.")
        self.emit("memory-end", **summary)
        cost = self.cost
        steps = max(cost["steps"], 1)
        self.emit(
            "memory-cost",
            per_step_us=round(cost["per_step_s"] / steps * 1e6, 2),
            per_step_median_us=round(self._typical_cost() * 1e6, 2),
            rss_every=self._rss_every,
            scans=cost["scans"],
            scan_ms_total=round(cost["scan_s"] * 1e3, 3),
            censuses=cost["censuses"],
            census_ms_total=round(cost["census_s"] * 1e3, 3),
        )


def _mib(nbytes: float | None) -> float | None:
    return None if nbytes is None else round(nbytes / MIB, 3)


def _mib_or_none(nbytes: int | None) -> float | None:
    return _mib(nbytes)

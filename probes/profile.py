"""The profile probe: `torch.profiler` over a short window of optimizer steps, and what the step is made of.

Measures, over `active_steps` steps after step `start_step` (earlier when
`--steps` leaves fewer):
- the step time split into data wait (time blocked in the DataLoader
  iterator's `__next__`), forward (inside the top-level modules' forward),
  backward (inside `torch.autograd.backward`), optimizer (between the
  optimizer step pre- and post-hooks) and other (the rest of the loop:
  zero_grad, the loss function, logging) — from wall-clock timestamps, so
  on CUDA forward and backward are the host's share unless the loop syncs;
- `torch.profiler` (CPU activities, plus CUDA when the script initialised
  it): a Chrome/Perfetto trace file (artifact `trace`, open it at
  https://ui.perfetto.dev); the operators with the most self time; the
  top-level operators per step and their mean duration (CPU), or the
  kernels per step, their mean duration and the GPU's busy fraction (CUDA);
- host-device syncs: `.item()`, `.tolist()`, `.numpy()`, `.cpu()`,
  `bool/float/int/format(tensor)`, `torch.cuda.synchronize()` called from
  the user's files, counted with their lines (probes/syncs.py; not while
  torch.compile is in use, where only the profiler's `aten::_local_scalar_dense`
  count is kept), and on CUDA the runtime's synchronize calls;
- CPU utilisation: the process's CPU time over the window's wall time (100%
  = one core busy) and the whole machine's (psutil); on CUDA, GPU utilisation
  from NVML (pynvml), sampled every 50 ms. Without a GPU: "not measured".

Costs: nothing outside the window. Inside it the profiler adds ~1-2 µs per
operator, the sync counter ~0.5 µs per counted call; after it, reading
the events, writing the trace and summarising take ~0.1-0.5 s once
(bench/bench_run.py measures steady-state steps after the window).

Symptoms (thresholds in rules/data/thresholds.toml, [profile]; classified in
doctor/analysis/profile.py)
-----------------------------------------------------------------------------
- dataloader-bound: data wait ≥ [data] wait_fraction of the window (only when
  the data probe did not run: it owns that symptom otherwise);
- host-sync: ≥ `min_syncs_per_step` sync calls per step (severity warning on
  CUDA, info on a CPU-only run where they cost nothing yet);
- low-gpu-util: GPU busy < `low_gpu_util` of the window (CUDA only);
- launch-bound: ≥ `launch_min_ops_per_step` operators (kernels on CUDA) per
  step averaging ≤ `launch_mean_op_us` (`launch_mean_kernel_us` on CUDA);
- slow-step: `other` ≥ `slow_other_fraction` of the step and ≥
  `slow_other_ms` per step.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from typing import Any

from torchdoctor.probes.base import Probe
from torchdoctor.probes.models import ModelMap, called_parts, is_compiled
from torchdoctor.probes.patches import backward_watch, compile_watch, data_watch
from torchdoctor.probes.syncs import SyncCounter


@contextmanager
def quiet_kineto():
    """Kineto prints 'USDT: … profiler_start/stop' to fd 2 on every start and stop: keep the
    script's stderr clean, and pass through anything else written meanwhile."""
    import sys

    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().splitlines(keepends=True) if not line.startswith(b"USDT:")]
            if kept:
                os.write(2, b"".join(kept))


OP_PREFIXES = ("aten::", "autograd::engine::evaluate_function")  # an operator, forward or backward


class _GpuSampler:
    """NVML utilisation every 50 ms while the window runs (thin; CUDA only).

    `torch.cuda.utilization` reads NVML through pynvml and maps the device through
    CUDA_VISIBLE_DEVICES; it raises without pynvml or a driver, and the caller degrades.
    """

    def __init__(self, torch: Any, device: int) -> None:
        self.read = lambda: int(torch.cuda.utilization(device))
        self.samples: list[int] = [self.read()]
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="torchdoctor-nvml", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.samples.append(self.read())
            except Exception:  # noqa: BLE001
                return

    def stop(self) -> float | None:
        self._stop.set()
        self.thread.join(timeout=1.0)
        return round(sum(self.samples) / len(self.samples) / 100, 4) if self.samples else None


class ProfileProbe(Probe):
    name = "profile"

    def install(self) -> None:
        import torch

        self.torch = torch
        opt = self.options
        self.active = max(1, int(opt.get("active_steps", 5)))
        start = max(1, int(opt.get("start_step", 5)))
        limit = self.session.steps_limit
        if limit:
            start = min(start, max(1, limit - self.active))
        self.start_step = start
        self.top = int(opt.get("top_ops", 10))
        self.max_events = int(opt.get("max_events", 300_000))
        self.backward = backward_watch(torch)
        self.data = data_watch(torch)
        self.compiles = compile_watch(torch)
        self.window: dict[str, Any] | None = None
        self.done = False
        self._pre_t: float | None = None

    # -- the window -------------------------------------------------------------------------------

    def before_step(self, step: int, optimizer: Any) -> None:
        if self.window is not None:
            self._pre_t = time.perf_counter()

    def after_step(self, step: int, optimizer: Any) -> None:
        now = time.perf_counter()
        w = self.window
        if w is not None:
            if self._pre_t is not None:
                w["optimizer_s"] += now - self._pre_t
                self._pre_t = None
            w["steps"] += 1
            if w["steps"] >= self.active:
                self._close(now)
            return None
        if not self.done and step == self.start_step:
            self._open(optimizer)
        return None

    def _open(self, optimizer: Any) -> None:
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        cuda = bool(torch.cuda.is_available() and torch.cuda.is_initialized())
        compiled = self._compiled()
        w: dict[str, Any] = {"cuda": cuda, "compiled": compiled, "steps": 0, "optimizer_s": 0.0, "forward_s": 0.0,
                             "notes": [], "handles": [], "depth": 0, "fw_t": 0.0}
        self._hook_models(optimizer, w)
        if not compiled:
            w["syncs"] = SyncCounter(torch, cuda)
        else:
            w["notes"].append("torch.compile is in use: sync calls are counted from the profiler's "
                              "aten::_local_scalar_dense events, without their lines")
        if cuda:
            try:
                w["gpu"] = _GpuSampler(torch, torch.cuda.current_device())
            except Exception as exc:  # noqa: BLE001 - NVML missing or refused: the profiler's kernel time remains
                w["notes"].append(f"NVML unavailable ({type(exc).__name__}); GPU utilisation from kernel time only")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        prof = profile(activities=activities, record_shapes=False, profile_memory=False, with_stack=False)
        with quiet_kineto():
            prof.start()
        w["prof"] = prof
        w["cpu0"] = _cpu_times()
        w["psutil"] = _system_cpu()
        if w.get("syncs") is not None:
            w["syncs"].start()
        w["data0"], w["backward0"] = self.data.wait_s, self.backward.busy_s
        w["t0"] = time.perf_counter()
        w["step0"] = self.step
        self.window = w

    def _compiled(self) -> bool:
        if self.compiles.calls:
            return True
        import sys

        utils = sys.modules.get("torch._dynamo.utils")
        try:
            return bool(utils and utils.counters["stats"]["unique_graphs"])
        except Exception:  # noqa: BLE001
            return True

    def _hook_models(self, optimizer: Any, w: dict[str, Any]) -> None:
        """Time the top-level modules' forward (module hooks, removed at the end of the window)."""
        params = [p for g in optimizer.param_groups for p in g["params"]]
        try:
            names = ModelMap.build(self.torch, params)
        except Exception as exc:  # noqa: BLE001
            w["notes"].append(f"forward time not measured: the models were not found ({type(exc).__name__})")
            return
        for root in names.roots:
            if w["compiled"] and not is_compiled(root):
                w["notes"].append(f"forward of `{names.label(root)}` not timed: it runs inside compiled code")
                continue
            # The root and its direct children: a LightningModule's training_step calls `self.net(x)`, never the
            # root's own forward; when the root's forward does run, its children are nested in it (`depth`) and
            # their time is not counted twice. A ModuleDict/ModuleList is never called itself: its parts are.
            seen: set[int] = set()
            for module in (*called_parts(self.torch, root),
                           *(p for child in root.children() for p in called_parts(self.torch, child))):
                if id(module) in seen:
                    continue
                seen.add(id(module))
                w["handles"].append(module.register_forward_pre_hook(self._fw_pre))
                w["handles"].append(module.register_forward_hook(self._fw_post))
        w["models"] = names.root_labels

    def _fw_pre(self, module: Any, args: Any) -> None:
        w = self.window
        if w is None or self.torch.compiler.is_compiling():
            return
        if w["depth"] == 0:
            w["fw_t"] = time.perf_counter()
        w["depth"] += 1

    def _fw_post(self, module: Any, args: Any, output: Any) -> None:
        w = self.window
        if w is None or self.torch.compiler.is_compiling() or w["depth"] == 0:
            return
        w["depth"] -= 1
        if w["depth"] == 0:
            w["forward_s"] += time.perf_counter() - w["fw_t"]

    def _close(self, now: float) -> None:
        w = self.window
        self.window = None
        self.done = True
        for hook in ("before_step", "after_step"):  # one window per run: nothing more to time at any step
            self.session.stop_calling(self, hook)
        if w is None:
            return
        for h in w["handles"]:
            h.remove()
        syncs = w.get("syncs")
        if syncs is not None:
            syncs.stop()
        wall = now - w["t0"]
        data_s = self.data.wait_s - w["data0"]
        backward_s = self.backward.busy_s - w["backward0"]
        cpu1 = _cpu_times()
        system = w["psutil"].cpu_percent(interval=None) if w.get("psutil") is not None else None
        with quiet_kineto():
            w["prof"].stop()
        gpu_util = w["gpu"].stop() if "gpu" in w else None
        steps = max(w["steps"], 1)
        started = time.perf_counter()
        summary = self._summarise(w, steps, wall)
        trace = self.artifact_path("trace.json")
        try:
            w["prof"].export_chrome_trace(trace)
            self.artifact("trace", trace)
        except Exception as exc:  # noqa: BLE001
            w["notes"].append(f"could not write the trace ({type(exc).__name__}: {exc})")
        event: dict[str, Any] = {
            "from_step": w["step0"] + 1,
            "to_step": w["step0"] + w["steps"],
            "steps": w["steps"],
            "step_ms": round(wall / steps * 1e3, 3),
            "data_ms": round(data_s / steps * 1e3, 3),
            "forward_ms": round(w["forward_s"] / steps * 1e3, 3) if w["handles"] else None,
            "backward_ms": round(backward_s / steps * 1e3, 3),
            "optimizer_ms": round(w["optimizer_s"] / steps * 1e3, 3),
            "device": "cuda" if w["cuda"] else "cpu",
            "compiled": w["compiled"],
            "models": w.get("models", []),
            **summary,
        }
        event["process_cpu_percent"] = round((cpu1 - w["cpu0"]) / wall * 100, 1) if wall > 0 else None
        event["system_cpu_percent"] = system
        event["cpu_count"] = _cpus()
        if w["cuda"]:
            event["nvml_gpu_util"] = gpu_util
        if syncs is not None:
            event["sync_calls"] = syncs.summary(steps)
            event["sync_calls_total"] = sum(syncs.calls.values())
        event["notes"] = w["notes"]
        event["summary_ms"] = round((time.perf_counter() - started) * 1e3, 1)
        self.emit("profile", **event)

    def _summarise(self, w: dict[str, Any], steps: int, wall: float) -> dict[str, Any]:
        from torch._C._autograd import DeviceType

        try:
            raw = w["prof"].profiler.kineto_results.events()
        except Exception as exc:  # noqa: BLE001
            w["notes"].append(f"profiler events unavailable ({type(exc).__name__})")
            return {}
        if len(raw) > self.max_events:
            w["notes"].append(f"{len(raw)} profiler events: only the first {self.max_events} summarised")
            raw = raw[: self.max_events]
        by_thread: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
        kernels: list[tuple[int, int]] = []
        copies = 0
        runtime_syncs = 0
        for e in raw:
            name = e.name()
            if not name or name.startswith("["):
                continue
            if e.device_type() == DeviceType.CPU:
                if e.start_thread_id() != e.end_thread_id() or e.is_async():
                    continue
                by_thread[e.start_thread_id()].append((e.start_ns(), e.end_ns(), name))
                if "Synchronize" in name:
                    runtime_syncs += 1
            elif e.device_type() == DeviceType.CUDA:
                if name.startswith(("Memcpy", "Memset")):
                    copies += 1
                else:
                    kernels.append((e.start_ns(), e.end_ns()))
        calls: Counter[str] = Counter()
        top_level: list[int] = []  # durations of operators not nested in another operator
        for rows in by_thread.values():
            rows.sort(key=lambda r: (r[0], -r[1]))
            stack: list[tuple[int, bool]] = []  # (end, inside an operator)
            for start, end, name in rows:
                while stack and stack[-1][0] <= start:
                    stack.pop()
                is_op = name.startswith(OP_PREFIXES)
                inside = bool(stack) and stack[-1][1]
                if is_op and not inside:
                    top_level.append(end - start)
                calls[name] += 1
                stack.append((end, inside or is_op))
        self_ns = _self_times(by_thread)
        top = [
            {"name": n, "self_ms_per_step": round(ns / steps / 1e6, 4), "calls_per_step": round(calls[n] / steps, 2),
             "self_fraction": round(ns / (wall * 1e9), 4) if wall > 0 else None}
            for n, ns in self_ns.most_common(self.top)
        ]
        aten = [(n, ns) for n, ns in self_ns.most_common() if n.startswith("aten::")]
        out: dict[str, Any] = {
            "top_ops": top,
            "top_op": aten[0][0] if aten else (top[0]["name"] if top else None),
            "ops_per_step": round(len(top_level) / steps, 2),
            "mean_op_us": round(sum(top_level) / len(top_level) / 1e3, 3) if top_level else None,
            "local_scalar_dense_per_step": round(calls.get("aten::_local_scalar_dense", 0) / steps, 3),
            "events": len(raw),
        }
        if w["cuda"]:
            out["kernels_per_step"] = round(len(kernels) / steps, 2)
            out["mean_kernel_us"] = round(sum(b - a for a, b in kernels) / len(kernels) / 1e3, 3) if kernels else None
            out["gpu_busy_fraction"] = round(_union_ns(kernels) / (wall * 1e9), 4) if wall > 0 else None
            out["copies_per_step"] = round(copies / steps, 2)
            out["runtime_syncs_per_step"] = round(runtime_syncs / steps, 3)
        return out

    def finish(self, reason: str) -> None:
        if self.window is not None and self.window["steps"] >= 1:
            self._close(time.perf_counter())
        elif self.window is not None:
            w, self.window = self.window, None
            for h in w["handles"]:
                h.remove()
            if w.get("syncs") is not None:
                w["syncs"].stop()
            with quiet_kineto():
                w["prof"].stop()
            if "gpu" in w:
                w["gpu"].stop()
        if not self.done:
            self.emit("profile-skipped", reason=reason, steps=self.step, start_step=self.start_step,
                      text=f"the profile window starts after step {self.start_step}; the script ended after "
                      f"{self.step} optimizer steps")


def _self_times(by_thread: dict[int, list[tuple[int, int, str]]]) -> Counter[str]:
    """Self time per operator name: its duration minus its direct children's, per thread."""
    out: Counter[str] = Counter()
    for rows in by_thread.values():
        rows = sorted(rows, key=lambda r: (r[0], -r[1]))
        stack: list[list[Any]] = []  # [end, name, self_ns]
        for start, end, name in rows:
            while stack and stack[-1][0] <= start:
                done = stack.pop()
                out[done[1]] += max(done[2], 0)
            if stack:
                stack[-1][2] -= end - start
            stack.append([end, name, end - start])
        for done in stack:
            out[done[1]] += max(done[2], 0)
    return out


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _cpu_times() -> float:
    """This process's CPU seconds, every thread (CLOCK_PROCESS_CPUTIME_ID: ns resolution, not 10 ms ticks)."""
    return time.process_time()


def _system_cpu() -> Any:
    """psutil's system-wide CPU counter (per-window percentage), or None without psutil."""
    try:
        import psutil

        psutil.cpu_percent(interval=None)  # starts the interval
        return psutil
    except Exception:  # noqa: BLE001 - psutil missing: only the process's own share is measured
        return None


def _cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()

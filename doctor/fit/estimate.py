"""The parent side of `torchdoctor fit`: run the child at two batch sizes, read its allocation
events into a peak and a breakdown, replay the caching allocator for the reserved peak, and answer
per GPU. No torch here: the child does the tensor work.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("parameter", "gradient", "optimizer_state", "activation")
BREAKDOWN = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer_state",
             "activation": "activations"}
BLOCK = 512  # the caching allocator's smallest block and rounding unit


class FitError(Exception):
    """The estimate could not be made; the message says why, with the user's line when there is one."""


@dataclass
class Step:
    """One measured training step at one batch size."""

    batch: int | None
    peak_allocated: int
    peak_reserved: int
    breakdown: dict[str, int]
    phases: dict[str, int]
    result: dict[str, Any] = field(repr=False)


def _block(nbytes: int) -> int:
    return max(BLOCK, math.ceil(nbytes / BLOCK) * BLOCK) if nbytes else 0


def walk(events: list, kinds: dict[str, str]) -> tuple[int, dict[str, int], dict[str, int]]:
    """One pass over the allocation events: the allocated peak (blocks rounded to 512 B), what was
    live at that moment by kind, and the peak inside optimizer steps ("optimizer") and outside them
    ("forward_backward"). The two phases grow differently with the batch: the step's peak hardly at
    all, the rest with the activations."""
    size: dict[int, int] = {}
    live = 0
    peak, peak_index = -1, 0
    phase = "forward_backward"
    phases = {"forward_backward": 0, "optimizer": 0}
    for i, (op, ident, nbytes) in enumerate(events):
        if op == "phase":
            phase = "optimizer" if ident == 1 else "forward_backward"
        elif op == "alloc":
            size[ident] = _block(nbytes)
            live += size[ident]
            phases[phase] = max(phases[phase], live)
            if live > peak:
                peak, peak_index = live, i
        else:
            live -= size.pop(ident, 0)
    # The live set at the peak: the allocations before it that were not freed before it.
    alive: dict[int, int] = {}
    for op, ident, nbytes in events[: peak_index + 1]:
        if op == "alloc":
            alive[ident] = _block(nbytes)
        elif op == "free":
            alive.pop(ident, None)
    breakdown = {name: 0 for name in (*BREAKDOWN.values(), "other")}
    for ident, block in alive.items():
        breakdown[BREAKDOWN.get(kinds.get(str(ident), ""), "other")] += block
    return max(peak, 0), breakdown, phases


def peak_of(events: list, kinds: dict[str, str]) -> tuple[int, dict[str, int]]:
    """The allocated peak and what was live at that moment, by kind."""
    peak, breakdown, _ = walk(events, kinds)
    return peak, breakdown


def reserved_of(events: list, allocated: int) -> int:
    """The caching allocator's reserved peak for this allocation sequence (allocator.py), or the
    allocated peak when the replay is not available."""
    try:
        from torchdoctor.fit.allocator import replay
    except ImportError:
        return allocated
    pairs = [(op, ident, nbytes) for op, ident, nbytes in events if op != "phase"]
    return int(replay(pairs).peak_reserved)


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="torchdoctor-fit-") as tmp:
        spec_path, out_path = Path(tmp, "spec.json"), Path(tmp, "out.json")
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
        try:
            proc = subprocess.run([sys.executable, "-m", "torchdoctor.fit.child", str(spec_path), str(out_path)],
                                  cwd=spec.get("cwd") or None, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise FitError(f"the step did not finish within {timeout:.0f} s under fake tensors") from exc
        if not out_path.exists():
            tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
            raise FitError(f"the estimate's child process failed: {tail[0][:300]}")
        result = json.loads(out_path.read_text())
        result["stdout_tail"] = (proc.stdout or "")[-2000:]
        return result


def measure(spec: dict[str, Any], batch: int | None, timeout: float, what_if: str | None = None) -> Step:
    result = run_child({**spec, "batch": batch, "what_if": what_if}, timeout)
    if result["stopped"] != "measured":
        raise FitError(_why_not_measured(result))
    allocated, breakdown, phases = walk(result["events"], result["kinds"])
    reserved = max(reserved_of(result["events"], allocated), allocated)
    seen = result.get("batch") or {}
    return Step(batch if batch is not None else seen.get("value"), allocated, reserved, breakdown, phases, result)


def _why_not_measured(result: dict[str, Any]) -> str:
    steps = result.get("steps", 0)
    if result["stopped"] == "blocked":
        where = result.get("where") or {}
        at = f" at {where.get('path')}:{where.get('line')} (`{where.get('code')}`)" if where else ""
        return f"the step could not run under fake tensors{at}: {result.get('error')}"
    if result["stopped"] == "script-exited":
        return f"the script exited (code {result.get('exit_code')}) after {steps} optimizer step(s), before the 2 measured"
    return f"the script ended after {steps} optimizer step(s): fit measures the second step of a training loop"


@dataclass
class Estimate:
    script: str
    first: Step
    second: Step | None
    cards: list[dict[str, Any]]
    what_if: list[dict[str, Any]]
    notes: list[str]

    def per_sample(self) -> float | None:
        if self.second is None or not self.first.batch or not self.second.batch:
            return None
        return (self.second.peak_reserved - self.first.peak_reserved) / (self.second.batch - self.first.batch)


def estimate(spec: dict[str, Any], cards: list[dict[str, Any]], timeout: float = 600,
             levers: bool = True, shards: int = 8) -> Estimate:
    notes: list[str] = []
    first = measure(spec, None, timeout)
    second = None
    if first.batch:
        second = measure(spec, first.batch * 2, timeout)
    else:
        notes.append("no batch-size argument was found (argparse names: " + ", ".join(_batch_names())
                     + "); the largest batch is not estimated (name it with --batch-arg)")
    est = Estimate(spec.get("script") or spec.get("module", ""), first, second, [], [], notes)
    for card in cards:
        est.cards.append(_card_answer(est, card))
    if levers:
        for change in ("bf16", "checkpoint", "set_to_none"):
            try:
                step = measure(spec, None, timeout, what_if=change)
            except FitError as exc:
                est.what_if.append({"change": change, "peak_bytes": None, "why": str(exc)})
                continue
            est.what_if.append({"change": change, "peak_bytes": step.peak_reserved})
        b = first.breakdown
        states = b["parameters"] + b["gradients"] + b["optimizer_state"]
        est.what_if.append({"change": f"shard parameters, gradients and optimizer state over {shards} GPUs",
                            "peak_bytes": int(first.peak_reserved - states + states / shards)})
    return est


def _batch_names() -> list[str]:
    from torchdoctor.fit.child import BATCH_DESTS
    return list(BATCH_DESTS)


def largest_batch(first: Step, second: Step, usable: int) -> int | None:
    """The largest batch whose step fits in `usable` bytes of reserved memory.

    Each phase (forward and backward; the optimizer step) is a straight line in the batch size
    through the two measured steps; the batch is the smallest of the phases' answers. Allocated
    bytes are turned into reserved bytes with the measured step's own ratio (the allocator's
    rounding and caching grow with it)."""
    if not first.batch or not second.batch or second.batch == first.batch or not first.peak_allocated:
        return None
    ratio = first.peak_reserved / first.peak_allocated
    budget = usable / ratio
    answers = []
    for phase, low in first.phases.items():
        slope = (second.phases.get(phase, 0) - low) / (second.batch - first.batch)
        if slope <= 0:
            if low > budget:
                return 0
            continue
        answers.append((budget - (low - slope * first.batch)) / slope)
    return max(0, int(min(answers))) if answers else None


def _card_answer(est: Estimate, card: dict[str, Any]) -> dict[str, Any]:
    context = card["context_bytes"]
    usable = card["bytes"] - context
    peak = est.first.peak_reserved
    answer = {"name": card["name"], "capacity_bytes": card["bytes"], "context_bytes": context,
              "fits": peak <= usable, "headroom_bytes": usable - peak, "max_batch_size": None}
    if est.second is not None:
        answer["max_batch_size"] = largest_batch(est.first, est.second, usable)
    return answer

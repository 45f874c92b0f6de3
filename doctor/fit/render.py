"""What `torchdoctor fit` prints: a few lines of text, or the JSON `fit` object."""

from __future__ import annotations

import json
from typing import Any

from torchdoctor.fit.estimate import Estimate
from torchdoctor.specialists.units import gib

GIB = 2**30
LEVER_NAMES = {"bf16": "bf16 autocast around the forward", "checkpoint": "activation checkpointing of the repeated blocks",
               "set_to_none": "zero_grad(set_to_none=True)"}


def _gib(n: float | None) -> str:
    """Bytes as the specialists write sizes (GiB, or MiB under 1 GiB)."""
    return "?" if n is None else gib(n / GIB)


def fit_object(est: Estimate) -> dict[str, Any]:
    first = est.first
    result = first.result
    return {
        "script": est.script,
        "batch_size": first.batch,
        "batch_arg": (result.get("batch") or {}).get("arg"),
        "peak_bytes": first.peak_reserved,
        "peak_allocated_bytes": first.peak_allocated,
        "breakdown": {**first.breakdown, "allocator_overhead": first.peak_reserved - first.peak_allocated},
        "bytes_per_sample": est.per_sample(),
        "autocast": result.get("autocast", []),
        "optimizers": result.get("optimizers", []),
        "values_read": result.get("faked_scalars", 0),
        "gpus": est.cards,
        "what_if": est.what_if,
        "notes": est.notes,
    }


def as_json(est: Estimate) -> str:
    """The usual Report (`torchdoctor schema`) with its `fit` object."""
    from torchdoctor.model import Report

    report = Report(command="fit", target=est.script, fit=fit_object(est))
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"


def as_text(est: Estimate) -> str:
    fit = fit_object(est)
    b = fit["breakdown"]
    batch = f" at batch {fit['batch_size']} (--{fit['batch_arg'].replace('_', '-')})" if fit["batch_arg"] else ""
    precision = f"{', '.join(fit['autocast'])} autocast" if fit["autocast"] else "no autocast"
    lines = [
        f"torchdoctor fit {est.script}: one training step{batch}, {precision}, {', '.join(fit['optimizers']) or 'no optimizer'}",
        "",
        f"Peak {_gib(fit['peak_bytes'])} reserved by the CUDA caching allocator ({_gib(fit['peak_allocated_bytes'])} in tensors), "
        "plus the CUDA context",
        "  at the peak: " + " · ".join(f"{name.replace('_', ' ')} {_gib(b[name])}" for name in
                                       ("parameters", "gradients", "optimizer_state", "activations", "other",
                                        "allocator_overhead")),
    ]
    if fit["bytes_per_sample"]:
        lines.append(f"  each sample of the batch adds {fit['bytes_per_sample'] / 2**20:.1f} MiB")
    lines += ["", f"  {'GPU':<14}{'memory':>11}  {'fits':<5}{'headroom':>11}  largest batch"]
    for card in fit["gpus"]:
        largest = "-" if card["max_batch_size"] is None else str(card["max_batch_size"])
        lines.append(f"  {card['name']:<14}{_gib(card['capacity_bytes']):>11}  {'yes' if card['fits'] else 'no':<5}"
                     f"{_gib(card['headroom_bytes']):>11}  {largest}")
    if fit["what_if"]:
        lines += ["", "What the usual levers would change (each measured by running the step again):"]
        for lever in fit["what_if"]:
            name = LEVER_NAMES.get(lever["change"], lever["change"])
            if lever["peak_bytes"] is None:
                lines.append(f"  {name}: not measured ({lever.get('why', '')})")
            else:
                delta = lever["peak_bytes"] - fit["peak_bytes"]
                lines.append(f"  {name}: peak {_gib(lever['peak_bytes'])} ({'+' if delta >= 0 else '-'}{_gib(abs(delta))})")
    notes = list(fit["notes"])
    if fit["values_read"]:
        notes.append(f"the script read {fit['values_read']} tensor value(s) (`.item()`, `if t:`); under fake tensors "
                     "they have no value, so a harmless one was given")
    notes.append("the CUDA context is counted per card (measured 0.51 GiB on an H100; assumed 0.56 GiB elsewhere); "
                 "NCCL buffers and memory outside PyTorch's allocator are not")
    lines += ["", *(f"note: {n}" for n in notes)]
    return "\n".join(lines) + "\n"

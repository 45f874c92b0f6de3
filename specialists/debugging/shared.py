"""What the debugging families share: the specialist they register on, and the fixes several of them rank.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Case, Specialist

SPECIALIST = Specialist("debugging")


def at_step(case: Case) -> str:
    step = case.step
    return f" at step {step}" if step is not None else ""


def on_rank(case: Case) -> str:
    rank = case.rank
    return f" on rank {rank}" if rank is not None else ""


def clip_fix(case: Case) -> Fix:
    if case.has("amp"):  # under a GradScaler, clipping needs unscale_ first
        return advice.fix("debugging", "clip-grad-norm-amp")
    return advice.fix("debugging", "clip-grad-norm")


def lr_fix() -> Fix:
    return advice.fix("debugging", "lower-lr-or-warm-up")


def anomaly_step() -> str:
    return (
        "Reproduce the failing step once under anomaly mode, which names the forward op whose backward produced "
        "the NaN (slow: use it on one step, not for training):\n"
        "with torch.autograd.detect_anomaly():\n    loss = criterion(model(x), y)\n    loss.backward()"
    )


def guard_fix(module: str | None) -> Fix:
    if module:  # the NaN probe named the first module with a non-finite output
        return advice.fix("debugging", "guard-module", module=module)
    return advice.fix("debugging", "guard-first-nonfinite-op")


def input_check_fix() -> Fix:
    return advice.fix("debugging", "assert-finite-batches")

"""What the debugging families share: the specialist they register on, and the fixes several of them rank.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Case, Specialist

SPECIALIST = Specialist("debugging")


def at_step(case: Case) -> str:
    step = case.step
    return f" at step {step}" if step is not None else ""


def on_rank(case: Case) -> str:
    rank = case.rank
    return f" on rank {rank}" if rank is not None else ""


def clip_fix(case: Case) -> Fix:
    amp = case.has("amp")
    snippet = (
        "scaler.scale(loss).backward()\n"
        "scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones\n"
        "norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
        "scaler.step(optimizer)\nscaler.update()"
        if amp
        else "loss.backward()\n"
        "norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
        "optimizer.step()"
    )
    return Fix(
        title="Clip the gradient norm before the optimizer step",
        snippet=snippet,
        why="One outlier batch can produce a huge update that throws the weights into a region where activations "
        "overflow; clipping bounds the update while keeping its direction.",
        verify="The returned `norm` is logged per step: spikes stay, but the loss no longer jumps to inf/NaN after them.",
    )


def lr_fix() -> Fix:
    return Fix(
        title="Lower the learning rate or add a warm-up",
        snippet=(
            "warmup = 500\n"
            "scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))\n"
            "# per batch: optimizer.step(); scheduler.step()"
        ),
        why="Divergence in the first hundreds of steps is most often a learning rate the freshly initialised "
        "network cannot take yet.",
        verify="With the LR divided by 10 (or a warm-up) the loss no longer turns non-finite at the same step.",
    )


def anomaly_step() -> str:
    return (
        "Reproduce the failing step once under anomaly mode, which names the forward op whose backward produced "
        "the NaN (slow: use it on one step, not for training):\n"
        "with torch.autograd.detect_anomaly():\n    loss = criterion(model(x), y)\n    loss.backward()"
    )


def guard_fix(module: str | None) -> Fix:
    return Fix(
        title=f"Make `{module}` numerically safe" if module else "Guard the op that first goes non-finite",
        snippet=(
            "x = torch.log(x.clamp_min(1e-12))           # log of 0 -> -inf\n"
            "y = a / (b + 1e-8)                          # division by 0 -> inf\n"
            "z = torch.sqrt(x.clamp_min(1e-12))          # sqrt'(0) = inf in backward\n"
            "p = torch.nn.functional.log_softmax(logits, dim=-1)  # not log(softmax(...))"
        ),
        why="A log of zero, a division by a vanishing denominator, a sqrt at zero (infinite slope) or an exp that "
        "overflows produces the first inf, and every later op turns it into NaN.",
        verify="The NaN probe no longer reports a first bad module at that step.",
        location=None,
    )


def input_check_fix() -> Fix:
    return Fix(
        title="Rule out the data: assert every batch is finite",
        snippet=(
            "for x, y in loader:\n"
            "    if not torch.isfinite(x).all():\n"
            "        raise ValueError('non-finite values in an input batch')\n"
            "    ..."
        ),
        why="A single NaN in one sample turns the whole batch's loss NaN, whatever the model does.",
        verify="A full pass over the loader raises nothing.",
    )

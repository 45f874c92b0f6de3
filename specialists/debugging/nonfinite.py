"""NaN/Inf and gradient health: a loss, a gradient or an input that is not finite, gradients that explode
or vanish, a loss scale that collapses.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case
from torchdoctor.specialists.debugging.shared import (
    SPECIALIST,
    anomaly_step,
    at_step,
    clip_fix,
    guard_fix,
    input_check_fix,
    lr_fix,
    on_rank,
)
from torchdoctor.specialists.units import count, sci


@SPECIALIST.handles("nan-loss")
def nan_loss(case: Case) -> Advice:
    module = case.text("first_bad_module")
    phase = case.text("phase")
    lr = case.num("lr")
    where = case.at()
    facts = f"The loss became non-finite{at_step(case)}{on_rank(case)}"
    if module:
        facts += f"; the first module whose output was non-finite while its inputs were finite is `{module}`"
        if phase:
            facts += f" ({phase} pass)"
    elif where:
        facts += f"; the first non-finite value appears at {where}"
    facts += "."
    if lr is not None:
        facts += f" The learning rate at that step was {sci(lr)}."
    if not module and not where:
        facts += " Find the first op that produces it before changing precision or the optimizer."
    guard = guard_fix(module)
    guard.location = case.location
    fixes = [guard, clip_fix(case), lr_fix()]
    if case.has("amp"):
        fixes.append(_fp32_region_fix())
    fixes.append(input_check_fix())
    return Advice(
        facts,
        fixes,
        [
            f"`{case.run_cmd('nan', extra='--steps 200')}` stops at the first non-finite loss, gradient or "
            "parameter and names the first module that produced it.",
            anomaly_step(),
        ],
    )


def _fp32_region_fix() -> Fix:
    return advice.fix("debugging", "fp32-region-or-bf16")


@SPECIALIST.handles("nonfinite-grad")
def nonfinite_grad(case: Case) -> Advice:
    module = case.text("first_bad_module", "parameter")
    backward_fn = case.text("function")
    facts = f"Gradients contain NaN or Inf{at_step(case)}{on_rank(case)}"
    if module:
        facts += f", first in `{module}` during backward"
    elif backward_fn:
        facts += f"; anomaly mode saw `{backward_fn}` return NaN"
    facts += "."
    if case.has("amp"):
        facts += (
            " Under float16 autocast with a GradScaler an occasional inf gradient is expected: the scaler skips "
            "that step and lowers the scale; it is a problem only when it repeats."
        )
    else:
        facts += " The forward pass may be finite while its derivative is not (sqrt or pow at 0, a norm of a zero vector)."
    guard = guard_fix(module)
    guard.location = case.location
    return Advice(
        facts,
        [
            guard,
            clip_fix(case),
            advice.fix("debugging", "fail-fast-on-nonfinite-norm"),
        ],
        [
            f"`{case.run_cmd('nan', extra='--steps 200')}` localises the first parameter whose gradient turns non-finite.",
            anomaly_step(),
        ],
    )


@SPECIALIST.handles("nonfinite-input")
def nonfinite_input(case: Case) -> Advice:
    field = case.text("field")
    bad = case.num("nonfinite_count")
    batch = case.num("batch_index")
    facts = f"The batch itself contains NaN or Inf{at_step(case)}"
    if field:
        facts += f" in `{field}`"
    if bad is not None:
        facts += f" ({count(bad, 'non-finite value')})"
    if batch is not None:
        facts += f", batch {batch:.0f} of the epoch"
    facts += ": the model is not the cause."
    return Advice(
        facts,
        [
            advice.fix("debugging", "fix-bad-samples", location=case.location),
            advice.fix("debugging", "guarded-normalisation"),
            input_check_fix(),
        ],
        [f"`{case.run_cmd('nan', 'data', extra='--steps 50')}` reports which batch and field first carry a non-finite value."],
    )


@SPECIALIST.handles("exploding-gradients")
def exploding(case: Case) -> Advice:
    norm = case.num("grad_norm")
    ratio = case.num("grad_norm_ratio")
    layer = case.text("layer")
    facts = "The gradient norm grows by orders of magnitude"
    if norm is not None:
        facts = f"The total gradient norm reached {sci(norm)}{at_step(case)}"
    if ratio is not None:
        facts += f", and the first-to-last-layer gradient norm ratio is {sci(ratio)}"
    if layer:
        facts += f"; the largest gradients are in `{layer}`"
    facts += "."
    if case.num("lr") is not None:
        facts += f" Learning rate: {sci(case.num('lr'))}."
    return Advice(
        facts,
        [
            clip_fix(case),
            lr_fix(),
            advice.fix("debugging", "stabilise-architecture", location=case.location),
        ],
        [f"`{case.run_cmd('nan', extra='--steps 100')}` records per-layer gradient norms and the step where they blow up."],
    )


@SPECIALIST.handles("vanishing-gradients")
def vanishing(case: Case) -> Advice:
    ratio = case.num("grad_norm_ratio")
    layer = case.text("layer")
    facts = "The gradients reaching the early layers are near zero"
    if layer:
        facts = f"The gradients reaching `{layer}` are near zero"
    if ratio is not None:
        facts += f" (first-to-last-layer gradient norm ratio {sci(ratio)})"
    facts += f"{at_step(case)}: those layers barely train."
    return Advice(
        facts,
        [
            advice.fix("debugging", "non-saturating-activations", location=case.location),
            advice.fix("debugging", "initialise-for-activation"),
            advice.fix("debugging", "normalise-between-layers"),
        ],
        [f"`{case.run_cmd('nan', extra='--steps 50')}` reports per-layer gradient norms and their first-to-last ratio."],
    )


@SPECIALIST.handles("loss-scale-collapse")
def scale_collapse(case: Case) -> Advice:
    scale = case.num("scale")
    skipped = case.num("skipped_steps")
    facts = "The GradScaler keeps finding inf/NaN gradients and shrinking the scale"
    if scale is not None:
        facts += f" (now {sci(scale)})"
    if skipped is not None:
        facts += f"; {count(skipped, 'optimizer step')} skipped"
    facts += ": a persistent non-finite value in the forward or backward, not a precision setting, is the usual cause."
    return Advice(
        facts,
        [guard_fix(case.text("first_bad_module")), input_check_fix(), lr_fix()],
        [f"`{case.run_cmd('nan', extra='--steps 200')}` names the first module producing inf, scaler-aware."],
    )


@SPECIALIST.handles("anomaly-detection-enabled")
def anomaly_on(case: Case) -> Advice:
    slowdown = case.num("slowdown")
    cost = f" (measured: {slowdown:.1f}x slower steps)" if slowdown is not None else ""
    where = case.at("The script")
    return Advice(
        f"{where} leaves autograd anomaly detection on for the whole run{cost}: every op records a traceback and "
        "every backward checks for NaN.",
        [
            advice.fix("debugging", "anomaly-mode-off", location=case.location)
        ],
        [f"`{case.run_cmd('nan')}` localises non-finite values at a fraction of anomaly mode's cost."],
    )

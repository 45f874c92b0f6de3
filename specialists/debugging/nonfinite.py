"""NaN/Inf and gradient health: a loss, a gradient or an input that is not finite, gradients that explode
or vanish, a loss scale that collapses.
"""

from __future__ import annotations

from torchdoctor.model import Fix
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
    return Fix(
        title="Keep the overflowing op in float32, or train in bfloat16",
        snippet=(
            "with torch.autocast(device_type='cuda', enabled=False):\n"
            "    scores = fragile_op(q.float(), k.float())\n"
            "# or for the whole model, on hardware that supports it:\n"
            "with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n"
            "    loss = criterion(model(x), y)"
        ),
        why="float16 overflows above 65504; bfloat16 has float32's range, so the same op stays finite (and needs no GradScaler).",
        verify="The first bad module reported by the NaN probe disappears with the change.",
        applies_when="Only when the run uses float16 autocast (the amp context).",
    )


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
            Fix(
                title="Fail fast at the first non-finite gradient norm",
                snippet="norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, error_if_nonfinite=True)",
                why="Raising at the step where the gradient first goes non-finite keeps the weights intact for inspection.",
                verify="The run stops with a RuntimeError naming the step instead of drifting on with NaN weights.",
                applies_when="While debugging: under a GradScaler, non-finite gradients of skipped steps are normal.",
            ),
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
            Fix(
                title="Find and fix the bad samples at the source",
                snippet=(
                    "bad = [i for i in range(len(dataset))\n"
                    "       if not all(torch.isfinite(torch.as_tensor(t)).all() for t in dataset[i])]\n"
                    "print(len(bad), 'bad samples, e.g.', bad[:10])"
                ),
                why="Missing values, a division by a zero standard deviation in normalisation, or a corrupt file "
                "produce the NaN before the model sees it.",
                verify="The scan finds no bad samples; the NaN probe no longer reports non-finite inputs.",
                location=case.location,
            ),
            Fix(
                title="Normalise with a guarded denominator",
                snippet="x = (x - mean) / std.clamp_min(1e-6)",
                why="A constant feature has a standard deviation of 0, and dividing by it gives NaN for every sample.",
                verify="torch.isfinite(x).all() holds after normalisation.",
                applies_when="The data pipeline standardises features itself.",
            ),
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
            Fix(
                title="Stabilise the architecture: normalisation and residual scaling",
                snippet=(
                    "class Block(nn.Module):\n"
                    "    def __init__(self, d):\n"
                    "        super().__init__()\n"
                    "        self.norm = nn.LayerNorm(d)\n"
                    "        self.ff = nn.Linear(d, d)\n"
                    "    def forward(self, x):\n"
                    "        return x + self.ff(self.norm(x))  # pre-norm residual"
                ),
                why="Deep stacks without normalisation multiply per-layer gains; pre-norm residual blocks keep the "
                "gradient scale roughly constant with depth.",
                verify="Per-layer gradient norms (the NaN probe reports them) stay within one or two orders of magnitude.",
                location=case.location,
                applies_when="The growth is structural (deep MLP/RNN stacks), not a single outlier batch.",
            ),
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
            Fix(
                title="Use non-saturating activations and residual connections",
                snippet="self.act = nn.GELU()   # instead of nn.Sigmoid() / nn.Tanh() between deep layers\n"
                "# and: return x + self.block(x)",
                why="Sigmoid and tanh have derivatives at most 0.25 and 1 that shrink further when saturated; "
                "a chain of them multiplies the gradient towards zero. Skip connections give it a direct path.",
                verify="The first-to-last-layer gradient norm ratio rises towards 1e-2..1.",
                location=case.location,
            ),
            Fix(
                title="Initialise for the activation you use",
                snippet="for m in model.modules():\n    if isinstance(m, nn.Linear):\n"
                "        nn.init.kaiming_normal_(m.weight, nonlinearity='relu')\n        nn.init.zeros_(m.bias)",
                why="Kaiming/Xavier initialisation keeps activation and gradient variance constant across layers.",
                verify="Per-layer gradient norms at step 0 are of similar size.",
                applies_when="For custom stacks; the built-in layers already use a sensible default.",
            ),
            Fix(
                title="Normalise between layers",
                snippet="nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d), nn.GELU())",
                why="Normalisation keeps pre-activations out of the saturated regions.",
                verify="Early-layer gradient norms grow; training loss falls faster.",
            ),
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
            Fix(
                title="Turn anomaly detection off, or scope it to one reproducing step",
                snippet="DEBUG = False\ntorch.autograd.set_detect_anomaly(DEBUG)\n"
                "# while debugging, around one failing step only:\n"
                "with torch.autograd.detect_anomaly():\n    loss.backward()",
                why="It is a debugging tool: it slows every step several times over and keeps stack traces alive.",
                verify="Step time returns to normal.",
                location=case.location,
            )
        ],
        [f"`{case.run_cmd('nan')}` localises non-finite values at a fraction of anomaly mode's cost."],
    )

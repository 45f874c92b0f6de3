"""Mixed precision and optimization: autocast, GradScaler, optimizers, schedulers, accumulation.

The fixes themselves are data (rules/data/advice/mixed-precision.toml); this module decides which
apply, in which order, which line each is pinned to, and fills in the measured micro-step count.
"""

from __future__ import annotations

from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, pct, sci

SPECIALIST = Specialist("mixed-precision")


@SPECIALIST.handles("fp16-without-scaler")
def fp16_without_scaler(case: Case) -> Advice:
    where = case.at("The training step")
    zeros = case.num("zero_grad_fraction")
    measured = f" Measured: {pct(zeros)} of gradient entries are exactly zero." if zeros is not None else ""
    return Advice(
        f"{where} runs backward on a float16-autocast loss without a GradScaler: small gradients flowing through "
        f"float16 activations underflow to zero and those updates are lost.{measured}",
        [
            advice.fix("mixed-precision", "grad-scaler", location=case.location),
            advice.fix("mixed-precision", "bf16-autocast"),
        ],
        [f"`{case.run_cmd('nan', extra='--steps 50')}` watches gradient magnitudes and the scaler once it is added."],
    )


@SPECIALIST.handles("clip-before-unscale")
def clip_before_unscale(case: Case) -> Advice:
    where = case.at("The step")
    scale = case.num("scale")
    factor = (f"{scale:.0f}" if scale >= 1 else sci(scale)) if scale is not None else "the loss scale (65536 at the start)"
    return Advice(
        f"{where} clips gradients that are still multiplied by {factor}: the true gradient norm is clipped to "
        f"max_norm divided by the scale, so almost every step is shrunk to nearly nothing.",
        [
            advice.fix("mixed-precision", "unscale-before-clip", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks the order of scale, unscale_, clip and step."],
    )


@SPECIALIST.handles("amp-dtype-mismatch")
def amp_dtype(case: Case) -> Advice:
    expected = case.text("expected_dtype", "dtype_b")
    found = case.text("found_dtype", "dtype_a")
    pair = f" ({expected} and {found})" if expected and found else ""
    if not pair and case.text("op") and case.text("dtype"):
        pair = f" (`{case.text('op')}` has no {case.text('dtype')} kernel)"
    where = case.at()
    return Advice(
        f"Half and Float tensors meet in an op that autocast does not cover{pair}"
        + (f" at {where}" if where else "")
        + ": usually a model cast with .half(), or your own op or custom Function running on autocast outputs.",
        [
            advice.fix("mixed-precision", "keep-model-float32", location=case.location),
            advice.fix("mixed-precision", "custom-fwd-cast"),
        ],
        [f"`{case.check_cmd('TD4')}` finds .half() casts and deprecated AMP calls."],
    )


@SPECIALIST.handles("deprecated-amp-api")
def deprecated_api(case: Case) -> Advice:
    call = case.text("call", "old", "api")
    new = case.text("new")
    where = case.at("The script")
    used = f"`{call}`" if call else "torch.cuda.amp"
    if new:
        used += f" (replace with `{new}`)"
    return Advice(
        f"{where} uses {used}, deprecated in favour of torch.amp with an explicit device type "
        "(PyTorch warns on each use).",
        [
            advice.fix("mixed-precision", "torch-amp-api", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` lists every deprecated call."],
    )


def _scale_facts(case: Case) -> str:
    scale = case.num("scale")
    skipped = case.num("skipped_steps")
    steps = case.num("steps")
    facts = []
    if scale is not None:
        facts.append(f"the scale fell to {sci(scale)}")
    if skipped is not None:
        share = f" of {count(steps, 'step')}" if steps is not None else ""
        facts.append(f"{count(skipped, 'step')}{share} were skipped")
    return (" (" + ", ".join(facts) + ")") if facts else ""


@SPECIALIST.handles("loss-scale-collapse")
def scale_collapse(case: Case) -> Advice:
    return Advice(
        f"The GradScaler keeps seeing inf/NaN gradients and halving the scale{_scale_facts(case)}: something overflows "
        "float16 on every step, so the optimizer barely ever steps.",
        [
            advice.fix("mixed-precision", "bf16-autocast"),
            advice.fix("mixed-precision", "fp32-island"),
            advice.fix("mixed-precision", "scaler-growth"),
        ],
        [
            f"`{case.run_cmd('nan', extra='--steps 200')}` logs the scale and skipped steps and names the first "
            "module producing inf.",
        ],
    )


@SPECIALIST.handles("nan-loss", "nonfinite-grad", "exploding-gradients")
def numerics_with_amp(case: Case) -> Advice:
    step = f" at step {case.step}" if case.step is not None else ""
    return Advice(
        f"From the precision side{step}: once debugging has found the first non-finite value, check whether it is "
        "a float16 overflow (values above 65504) rather than a model or data bug.",
        [
            advice.fix("mixed-precision", "bf16-autocast"),
            advice.fix("mixed-precision", "fp32-island"),
            advice.fix("mixed-precision", "grad-scaler"),
        ],
        [f"`{case.run_cmd('nan', extra='--steps 200')}` tells a float16 overflow (first bad module under autocast) from a data NaN."],
    )


_PER_BATCH = {"OneCycleLR", "CyclicLR", "LambdaLR", "LinearLR", "PolynomialLR", "SequentialLR"}


@SPECIALIST.handles("scheduler-granularity")
def scheduler_granularity(case: Case) -> Advice:
    kind = case.text("scheduler") or ("OneCycleLR" if "onecycle-overstep" in case.sources else "The scheduler")
    planned = case.num("lr_steps_planned", "total_steps")
    taken = case.num("lr_steps_taken", "steps_taken")
    per = case.text("stepped_per")
    where = case.at()
    name = kind if kind == "The scheduler" else f"`{kind}`"
    if planned is not None and taken is not None:
        if taken < planned:
            facts = (
                f"{name} was configured for {count(planned, 'step')} but will be stepped only {taken:.0f} times "
                f"({pct(taken / planned)} of its schedule): the run never leaves the early part of the curve."
            )
        elif kind == "OneCycleLR":
            facts = (
                f"{name} was configured for {count(planned, 'step')} but stepped {taken:.0f} times: it raises once "
                "it passes total_steps — it was sized in epochs but is stepped per batch."
            )
        else:
            facts = (
                f"{name} was configured for {count(planned, 'step')} but is stepped {taken:.0f} times: it runs "
                f"through its whole schedule {taken / planned:.0f} times over."
            )
    else:
        facts = f"{name} is stepped {'per ' + per if per else 'at the wrong granularity'}, but its length is counted in the other unit."
    if where:
        facts += f" The step call is at {where}."
    per_batch = kind in _PER_BATCH or (planned is not None and taken is not None and taken < planned)
    if kind == "OneCycleLR":
        per_batch = True
    fixes = [
        advice.fix("mixed-precision", "per-batch-schedule", location=case.location if per_batch else None),
        advice.fix("mixed-precision", "per-epoch-schedule", location=None if per_batch else case.location),
    ]
    if not per_batch:
        fixes.reverse()
    return Advice(
        facts,
        fixes,
        [f"`{case.run_cmd(extra='--steps 200')}` records each scheduler's planned length and actual step count."],
    )


@SPECIALIST.handles("scheduler-order")
def scheduler_order(case: Case) -> Advice:
    where = case.at("The loop")
    return Advice(
        f"{where} calls scheduler.step() before optimizer.step(): the first learning-rate value of the schedule is "
        "skipped and every later step uses the next one.",
        [
            advice.fix("mixed-precision", "optimizer-then-scheduler", location=case.location),
        ],
        [
            f"`{case.check_cmd(case.rule_code('TD4'))}` checks the call order.",
            "Under a GradScaler the same warning can appear when the very first steps are skipped for inf "
            "gradients; that case is harmless.",
        ],
    )


@SPECIALIST.handles("scheduler-never-stepped")
def scheduler_never_stepped(case: Case) -> Advice:
    kind = case.text("scheduler") or "The scheduler"
    steps = case.num("optimizer_steps")
    where = case.at("The line that built it")
    taken = f" while the optimizer took {count(steps, 'step')}" if steps is not None else ""
    return Advice(
        f"{where} builds `{kind}` for the optimizer, but its step() was never called{taken}: the learning rate "
        "stayed at its initial value for the whole run.",
        [advice.fix("mixed-precision", "step-the-scheduler", location=case.location)],
        [f"`{case.run_cmd(extra='--steps 200')}` records each scheduler's step count next to its optimizer's."],
    )


@SPECIALIST.handles("accumulation-not-normalized")
def accumulation_not_normalized(case: Case) -> Advice:
    micro = case.num("micro_steps")
    where = case.at("The accumulation loop")
    k = f"{micro:.0f}" if micro is not None else "N"
    accum_steps = k if micro is not None else "4"  # the snippet needs a number: measured, or an example
    return Advice(
        f"{where} sums the gradients of {k} micro-batches without dividing the loss by {k}: the gradient is {k}x "
        "the mean gradient of the effective batch.",
        [
            advice.fix("mixed-precision", "divide-loss-by-micro-steps", location=case.location,
                       accum_steps=accum_steps)
        ],
        [f"`{case.run_cmd(extra='--steps 20')}` compares accumulated gradient norms with the micro-step count."],
    )


@SPECIALIST.handles("accumulation-divided-twice")
def accumulation_divided_twice(case: Case) -> Advice:
    micro = case.num("micro_steps")
    k = f"{micro:.0f}" if micro is not None else "N"
    return Advice(
        f"The loss is divided by the {k} micro-steps twice: once by the accumulation the framework does for you "
        f"(Lightning's accumulate_grad_batches, accelerate's accumulate(), the Trainer's gradient_accumulation_steps) "
        f"and once more in the script, so each update is 1/{k} of the effective batch's mean gradient, as if the "
        f"learning rate were {k}x smaller.",
        [
            advice.fix("mixed-precision", "divide-once", location=case.location, micro_steps=k)
        ],
        [f"`{case.run_cmd(extra='--steps 20')}` measures the loss factor and the micro-steps per step."],
    )


@SPECIALIST.handles("partial-accumulation-dropped")
def partial_accumulation(case: Case) -> Advice:
    dropped = case.num("dropped_micro_steps")
    micro = case.num("micro_steps")
    facts = "The last micro-batches of each epoch accumulate gradients that never reach optimizer.step()"
    if dropped is not None:
        facts = f"{count(dropped, 'micro-batch', 'micro-batches')} at the end of each epoch accumulate gradients that never reach optimizer.step()"
        if micro is not None:
            facts += f" (accumulating {micro:.0f} per step)"
    facts += "; they also leak into the first step of the next epoch unless zero_grad runs first."
    return Advice(
        facts,
        [
            advice.fix("mixed-precision", "step-on-last-batch", location=case.location),
            advice.fix("mixed-precision", "drop-partial-batch"),
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks accumulation loops."],
    )


@SPECIALIST.handles("weight-decay-on-norm-bias")
def decay_groups(case: Case) -> Advice:
    where = case.at("The optimizer")
    return Advice(
        f"{where} applies weight decay to every parameter, including biases, normalisation weights and embeddings, "
        "which pulls them towards zero for no regularisation benefit.",
        [
            advice.fix("mixed-precision", "no-decay-group", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks optimizer construction."],
    )


@SPECIALIST.handles("adam-weight-decay")
def adam_decay(case: Case) -> Advice:
    wd = case.num("weight_decay")
    where = case.at("The optimizer")
    value = f"weight_decay={sci(wd)}" if wd is not None else "weight_decay"
    return Advice(
        f"{where} passes {value} to Adam, which adds it to the gradient as L2 and then divides it by the adaptive "
        "denominator: parameters with large gradients are barely decayed. AdamW decouples the decay.",
        [
            advice.fix("mixed-precision", "adamw", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks optimizer construction."],
    )


@SPECIALIST.handles("missing-zero-grad")
def missing_zero_grad(case: Case) -> Advice:
    where = case.at("The training loop")
    return Advice(
        f"{where} never clears gradients: each optimizer step applies the sum of every gradient so far.",
        [
            advice.fix("mixed-precision", "zero-grad-per-step", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks the loop's zero_grad / backward / step order."],
    )


@SPECIALIST.handles("zero-grad-every-micro-step")
def zero_grad_every_micro_step(case: Case) -> Advice:
    where = case.at("The accumulation loop")
    count = case.text("accum_expr") or "accum_steps"
    step = case.text("step_call") or "optimizer.step()"
    return Advice(
        f"{where} clears the gradients on every micro-step while `{step}` runs once per {count}: each update "
        "applies the last micro-batch's gradients only, so the accumulation does nothing.",
        [
            advice.fix("mixed-precision", "zero-grad-after-step", location=case.location, accum_expr=count)
        ],
        [f"`torchdoctor run --probe accumulation {case.script}` counts the backward passes per optimizer step "
         "and the zero_grad calls between them."],
    )


@SPECIALIST.handles("accumulation-not-applied")
def accumulation_not_applied(case: Case) -> Advice:
    where = case.at("The training loop")
    count = case.text("accum_expr") or "accum_steps"
    step = case.text("step_call") or "optimizer.step()"
    return Advice(
        f"{where} divides the loss by `{count}` as gradient accumulation does, but `{step}` runs on every "
        f"micro-batch: no gradients accumulate, and every update is `{count}` times smaller than intended.",
        [
            advice.fix("mixed-precision", "step-per-accumulation-group", location=case.location,
                       accum_expr=count),
            advice.fix("mixed-precision", "drop-division", location=case.location),
        ],
        [f"`torchdoctor run --probe accumulation {case.script}` counts backward passes per optimizer step."],
    )


@SPECIALIST.handles("fp16-overflow")
def fp16_overflow(case: Case) -> Advice:
    where = case.at("The code")
    number = case.text("number") or "a constant"
    call = case.text("call") or "masked_fill"
    return Advice(
        f"{where} writes {number} with `{call}`, past float16's largest value (65504): in float32 it works, but under "
        "fp16 autocast or after `.half()` the tensor is float16 and the call raises "
        "'value cannot be converted to type c10::Half without overflow'.",
        [
            advice.fix("mixed-precision", "finfo-min", location=case.location)
        ],
        [f"`{case.check_cmd('TD4')}` lists the other fp16 hazards of the script."],
    )


@SPECIALIST.handles("scaler-with-bf16")
def scaler_with_bf16(case: Case) -> Advice:
    where = case.at("The script")
    return Advice(
        f"{where} uses a GradScaler with bfloat16 autocast: bf16 has float32's exponent range, so there is nothing to "
        "rescue, and scaler.step() still syncs the host with the device every step to check for inf.",
        [
            advice.fix("mixed-precision", "no-scaler-for-bf16", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks the AMP setup."],
    )


@SPECIALIST.handles("backward-in-autocast")
def backward_in_autocast(case: Case) -> Advice:
    where = case.at("The step")
    return Advice(
        f"{where} calls backward() inside the autocast block. PyTorch advises against it: backward ops already run "
        "in the dtype autocast chose for their forward ops, and keeping the region open also covers code that "
        "should not be autocast.",
        [
            advice.fix("mixed-precision", "backward-outside-autocast", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks the AMP setup."],
    )


_SCALER_MISUSE = {
    "unscale-twice": "scaler.unscale_(optimizer) ran twice for the same optimizer before update()",
    "scaler-no-inf-checks": "scaler.step() found no inf checks for the optimizer: its parameters got no "
    "gradients through scaler.scale(loss).backward() (backward on the unscaled loss, or parameters outside the graph)",
    "scaler-scale-none": "a GradScaler method ran before scaler.scale() was ever called",
}


@SPECIALIST.handles("scaler-misuse")
def scaler_misuse(case: Case) -> Advice:
    cause = next((text for src, text in _SCALER_MISUSE.items() if src in case.sources), None)
    call = case.text("call")
    where = case.at()
    facts = "GradScaler calls run out of order"
    if cause:
        facts = cause[:1].upper() + cause[1:]
    if call:
        facts += f" (in `{call}`)"
    if where:
        facts += f" at {where}"
    facts += ". The scaler expects, per optimizer step: scale(loss).backward(), at most one unscale_, step, update."
    return Advice(
        facts,
        [
            advice.fix("mixed-precision", "scaler-canonical-order", location=case.location),
            advice.fix("mixed-precision", "scaler-with-accumulation"),
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks the order of scaler calls."],
    )


@SPECIALIST.handles("mixed-precision-setup")
def setup(case: Case) -> Advice:
    return Advice(
        "Choose by hardware: bf16 autocast on Ampere-or-newer GPUs (no scaler), fp16 autocast with a GradScaler on "
        "older ones, and TF32 matmuls for whatever stays in float32.",
        [
            advice.fix("mixed-precision", "bf16-autocast"),
            advice.fix("mixed-precision", "grad-scaler"),
            advice.fix("mixed-precision", "tf32-matmuls"),
        ],
        [f"`{case.run_cmd('env')}` reports the GPU, bf16 support and the current matmul precision."],
    )


@SPECIALIST.general
def general(case: Case) -> Advice:
    symptom = case.symptom.title[:1].lower() + case.symptom.title[1:]
    speed = case.symptom.id in {"slow-step", "low-gpu-util", "launch-bound", "dataloader-bound", "host-sync"}
    if speed:
        text = (
            f"From the precision side of {symptom}: autocast speeds up compute-bound steps (large matmuls and "
            "convolutions); it cannot help a step that waits on data or on the host."
        )
    else:
        text = f"From the precision and optimizer side of {symptom}: check that the AMP recipe and the optimizer setup are the standard ones."
    return Advice(
        text,
        [advice.fix("mixed-precision", "bf16-autocast"), advice.fix("mixed-precision", "grad-scaler")],
        [f"`{case.check_cmd('TD4')}` checks the AMP, optimizer and scheduler setup in the source."],
    )

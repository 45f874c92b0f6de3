"""Mixed precision and optimization: autocast, GradScaler, optimizers, schedulers, accumulation."""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, pct, sci

SPECIALIST = Specialist("mixed-precision")

_FP16_LOOP = """\
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)          # only if you clip or inspect gradients
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)              # skips the step if gradients are inf/NaN
    scaler.update()"""

_BF16_LOOP = """\
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    loss.backward()                     # no GradScaler: bf16 has float32's range
    optimizer.step()"""


def _bf16_fix(location=None) -> Fix:
    return Fix(
        title="Use bfloat16 autocast, which needs no scaler",
        snippet=_BF16_LOOP,
        why="bfloat16 has float32's exponent range, so gradients neither underflow nor overflow the way float16's do.",
        verify="The loss curve matches float32 within noise; no scaler, no skipped steps.",
        applies_when="On GPUs with bf16 support (Ampere or newer: torch.cuda.is_bf16_supported()), and on CPU.",
        location=location,
    )


def _scaler_fix(location=None) -> Fix:
    return Fix(
        title="Scale the loss with torch.amp.GradScaler",
        snippet=_FP16_LOOP,
        why="float16 flushes values below about 6e-8 to zero; scaling the loss before backward keeps small "
        "gradients representable, and the scaler unscales them before the optimizer step.",
        verify="scaler.get_scale() settles at a stable value and only a few steps are skipped.",
        location=location,
    )


def _fp32_island_fix() -> Fix:
    return Fix(
        title="Keep the overflowing op in float32",
        snippet=(
            "with torch.autocast(device_type='cuda', enabled=False):\n"
            "    scores = (q.float() @ k.float().transpose(-2, -1)) * scale"
        ),
        why="float16's largest value is 65504. Autocast already runs softmax, exp, log, pow, layer_norm and the "
        "losses in float32, but matmul outputs (large attention logits) and your own element-wise arithmetic stay "
        "in float16 and can overflow.",
        verify="The scaler's scale stops falling; the NaN probe reports no first bad module.",
    )


@SPECIALIST.handles("fp16-without-scaler")
def fp16_without_scaler(case: Case) -> Advice:
    where = case.at("The training step")
    zeros = case.num("zero_grad_fraction")
    measured = f" Measured: {pct(zeros)} of gradient entries are exactly zero." if zeros is not None else ""
    return Advice(
        f"{where} runs backward on a float16-autocast loss without a GradScaler: small gradients flowing through "
        f"float16 activations underflow to zero and those updates are lost.{measured}",
        [_scaler_fix(case.location), _bf16_fix()],
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
            Fix(
                title="Call scaler.unscale_(optimizer) before clip_grad_norm_",
                snippet="scaler.scale(loss).backward()\nscaler.unscale_(optimizer)\n"
                "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
                "scaler.step(optimizer)   # knows the grads are unscaled; does not unscale twice\nscaler.update()",
                why="unscale_ divides the gradients by the scale in place, so clipping sees their true norm.",
                verify="The norm returned by clip_grad_norm_ is of the same order as in a float32 run.",
                location=case.location,
            )
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
            Fix(
                title="Let autocast choose dtypes: keep the model in float32",
                snippet="model = Net().cuda()            # no model.half()\n"
                "with torch.autocast(device_type='cuda', dtype=torch.float16):\n    out = model(x)",
                why="Autocast casts per op; a half model plus float32 inputs (or the reverse) fails in ops it does not list.",
                verify="The forward runs; parameters stay float32 (next(model.parameters()).dtype).",
                location=case.location,
            ),
            Fix(
                title="Cast explicitly at the boundary of custom code",
                snippet=(
                    "class MyOp(torch.autograd.Function):\n"
                    "    @staticmethod\n"
                    "    @torch.amp.custom_fwd(device_type='cuda', cast_inputs=torch.float32)\n"
                    "    def forward(ctx, x):\n"
                    "        ...\n\n"
                    "    @staticmethod\n"
                    "    @torch.amp.custom_bwd(device_type='cuda')\n"
                    "    def backward(ctx, grad):\n"
                    "        ..."
                ),
                why="custom_fwd(cast_inputs=...) runs the Function in float32 under autocast, and custom_bwd runs "
                "backward with the same autocast state as forward.",
                verify="The op receives float32 inputs under autocast.",
                applies_when="The failing op is a custom autograd.Function or an extension kernel.",
            ),
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
            Fix(
                title="Switch to torch.amp with device_type",
                snippet=(
                    "scaler = torch.amp.GradScaler('cuda')                 # was torch.cuda.amp.GradScaler()\n"
                    "with torch.autocast(device_type='cuda', dtype=torch.float16):  # was torch.cuda.amp.autocast()\n"
                    "    loss = criterion(model(x), y)"
                ),
                why="The torch.amp entry points are device-generic (CUDA, CPU, XPU, MPS) and the only ones maintained.",
                verify="No FutureWarning about torch.cuda.amp at start-up.",
                location=case.location,
            )
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
        [_bf16_fix(), _fp32_island_fix(), _scaler_tuning_fix()],
        [
            f"`{case.run_cmd('nan', extra='--steps 200')}` logs the scale and skipped steps and names the first "
            "module producing inf.",
        ],
    )


def _scaler_tuning_fix() -> Fix:
    return Fix(
        title="Let the scale recover sooner",
        snippet="scaler = torch.amp.GradScaler('cuda', init_scale=2.0**12, growth_interval=500)",
        why="After an early overflow burst the default scaler waits 2000 clean steps before doubling the scale again.",
        verify="scaler.get_scale() climbs back after transient overflows.",
        applies_when="Only once the source of the overflow is ruled out: it does not fix a persistent one.",
    )


@SPECIALIST.handles("nan-loss", "nonfinite-grad", "exploding-gradients")
def numerics_with_amp(case: Case) -> Advice:
    step = f" at step {case.step}" if case.step is not None else ""
    return Advice(
        f"From the precision side{step}: once debugging has found the first non-finite value, check whether it is "
        "a float16 overflow (values above 65504) rather than a model or data bug.",
        [_bf16_fix(), _fp32_island_fix(), _scaler_fix()],
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
        Fix(
            title="Step per-batch schedules after every optimizer step, sized in optimizer steps",
            snippet=(
                "steps_per_epoch = len(loader) // accum_steps\n"
                "scheduler = torch.optim.lr_scheduler.OneCycleLR(\n"
                "    optimizer, max_lr=3e-4, total_steps=epochs * steps_per_epoch)\n"
                "for epoch in range(epochs):\n"
                "    for x, y in loader:\n"
                "        ...\n"
                "        optimizer.step()\n"
                "        scheduler.step()   # per optimizer step, not per epoch"
            ),
            why="OneCycleLR, warm-up and cosine-by-steps schedules count optimizer steps; stepping them per epoch "
            "leaves the LR near its initial value for the whole run.",
            verify="Log scheduler.get_last_lr() per step: it follows the intended curve and ends near its final value.",
            location=case.location if per_batch else None,
        ),
        Fix(
            title="Step per-epoch schedules once per epoch",
            snippet=(
                "scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)\n"
                "for epoch in range(epochs):\n"
                "    train_one_epoch()\n"
                "    scheduler.step()   # after the epoch's optimizer steps"
            ),
            why="StepLR, MultiStepLR, ExponentialLR and CosineAnnealingLR(T_max=epochs) count epochs; stepping them "
            "per batch decays (or cycles) the LR within the first epoch.",
            verify="get_last_lr() changes once per epoch.",
            location=None if per_batch else case.location,
        ),
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
            Fix(
                title="Step the optimizer first, then the scheduler",
                snippet="loss.backward()\noptimizer.step()\nscheduler.step()\noptimizer.zero_grad()",
                why="Since PyTorch 1.1 schedulers expect to be stepped after the optimizer; PyTorch warns otherwise.",
                verify="No 'Detected call of `lr_scheduler.step()` before `optimizer.step()`' warning.",
                location=case.location,
            ),
        ],
        [
            f"`{case.check_cmd(case.rule_code('TD4'))}` checks the call order.",
            "Under a GradScaler the same warning can appear when the very first steps are skipped for inf "
            "gradients; that case is harmless.",
        ],
    )


@SPECIALIST.handles("accumulation-not-normalized")
def accumulation_not_normalized(case: Case) -> Advice:
    micro = case.num("micro_steps")
    where = case.at("The accumulation loop")
    k = f"{micro:.0f}" if micro is not None else "N"
    return Advice(
        f"{where} sums the gradients of {k} micro-batches without dividing the loss by {k}: the gradient is {k}x "
        "the mean gradient of the effective batch.",
        [
            Fix(
                title="Divide each micro-batch loss by the number of micro-steps",
                snippet=(
                    f"accum_steps = {k if micro is not None else 4}\n"
                    "for i, (x, y) in enumerate(loader):\n"
                    "    loss = criterion(model(x), y) / accum_steps\n"
                    "    loss.backward()\n"
                    "    if (i + 1) % accum_steps == 0:\n"
                    "        optimizer.step()\n"
                    "        optimizer.zero_grad()"
                ),
                why="With SGD the update is multiplied by the number of micro-steps; with Adam the scale mostly "
                "cancels, but gradient clipping thresholds and weight decay no longer mean what they did.",
                verify="The gradient norm per optimizer step matches a run with the full batch in one pass.",
                location=case.location,
            )
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
            Fix(
                title="Return the plain mean loss and let the accumulation divide it",
                snippet=(
                    "def training_step(self, batch, batch_idx):   # or compute_loss, or the accelerate loop\n"
                    "    x, y = batch\n"
                    f"    return criterion(self(x), y)   # no `/ {k}`: accumulation already divides by {k}"
                ),
                why="Gradient accumulation is meant to reproduce the gradient of the whole effective batch; a "
                "second division shrinks every update (and makes the gradient-clipping threshold mean something "
                "else).",
                verify="The loss factor on its way to backward is 1/micro-steps (the run's accumulation measurement).",
                location=case.location,
            )
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
            Fix(
                title="Step on the last batch too",
                snippet=(
                    "for i, (x, y) in enumerate(loader):\n"
                    "    loss = criterion(model(x), y) / accum_steps\n"
                    "    loss.backward()\n"
                    "    if (i + 1) % accum_steps == 0 or i + 1 == len(loader):\n"
                    "        optimizer.step()\n"
                    "        optimizer.zero_grad()"
                ),
                why="Every sample then contributes to an update; the partial window is slightly down-weighted, which is usually fine.",
                verify="Optimizer steps per epoch == ceil(len(loader) / accum_steps).",
                location=case.location,
            ),
            Fix(
                title="Or drop the partial batch explicitly",
                snippet="loader = DataLoader(ds, batch_size=bs, drop_last=True)  # and len(loader) divisible by accum_steps",
                why="Makes every optimizer step see the same number of samples.",
                verify="No leftover micro-steps at epoch end.",
                applies_when="Equal-size steps matter more than using every sample.",
            ),
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks accumulation loops."],
    )


_DECAY_GROUPS = """\
decay, no_decay = [], []
for name, p in model.named_parameters():
    if not p.requires_grad:
        continue
    if p.ndim < 2 or "norm" in name.lower() or "embed" in name.lower():
        no_decay.append(p)          # biases, LayerNorm/BatchNorm weights, embeddings
    else:
        decay.append(p)
optimizer = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=3e-4)"""


@SPECIALIST.handles("weight-decay-on-norm-bias")
def decay_groups(case: Case) -> Advice:
    where = case.at("The optimizer")
    return Advice(
        f"{where} applies weight decay to every parameter, including biases, normalisation weights and embeddings, "
        "which pulls them towards zero for no regularisation benefit.",
        [
            Fix(
                title="Use two parameter groups: decay matrices only",
                snippet=_DECAY_GROUPS,
                why="Decay regularises weight matrices; on norm gains and biases it only fights the values they need.",
                verify="len(optimizer.param_groups) == 2 and the no-decay group holds every 1-D parameter.",
                location=case.location,
            )
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
            Fix(
                title="Switch to AdamW (and retune the decay)",
                snippet="optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)",
                why="AdamW shrinks every weight by lr * weight_decay per step, independent of its gradient history. "
                "Typical AdamW values (1e-2 to 1e-1) are far larger than L2 values used with Adam.",
                verify="Validation loss at the same budget is no worse; weight norms shrink steadily.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks optimizer construction."],
    )


@SPECIALIST.handles("missing-zero-grad")
def missing_zero_grad(case: Case) -> Advice:
    where = case.at("The training loop")
    return Advice(
        f"{where} never clears gradients: each optimizer step applies the sum of every gradient so far.",
        [
            Fix(
                title="Call optimizer.zero_grad() once per optimizer step",
                snippet="for x, y in loader:\n    optimizer.zero_grad()   # sets .grad to None (the default since 2.0)\n"
                "    loss = criterion(model(x), y)\n    loss.backward()\n    optimizer.step()",
                why="backward() accumulates into .grad by design (that is what makes accumulation possible).",
                verify="The gradient norm per step no longer grows step over step.",
                location=case.location,
            )
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
            Fix(
                title="Clear the gradients right after the optimizer step, inside its branch",
                snippet=f"loss = criterion(model(x), y) / {count}\nloss.backward()\n"
                f"if (i + 1) % {count} == 0:\n    optimizer.step()\n    optimizer.zero_grad()",
                why="backward() adds into .grad; the micro-steps' gradients must survive until the step that "
                "applies their sum.",
                verify=f"The gradient norm at each optimizer step is about {count}x that of one micro-batch "
                "(before the division by the micro-step count), not equal to it.",
                location=case.location,
            )
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
            Fix(
                title="Step and clear once per accumulation group",
                snippet=f"loss = criterion(model(x), y) / {count}\nloss.backward()\n"
                f"if (step + 1) % {count} == 0:\n    optimizer.step()\n    optimizer.zero_grad()",
                why="The division turns the sum of the group's gradients into their mean; it only makes sense "
                "when the step waits for the whole group.",
                verify=f"The number of optimizer steps per epoch is the number of batches divided by {count}.",
                location=case.location,
            ),
            Fix(
                title="Or drop the division, if no accumulation is wanted",
                snippet="loss = criterion(model(x), y)\nloss.backward()\noptimizer.step()",
                why="Without accumulation the division only scales the learning rate down.",
                verify="The update size matches a run without the accumulation setting.",
                location=case.location,
            ),
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
            Fix(
                title="Use the tensor's own dtype limit",
                snippet="scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
                why="finfo(dtype).min is the most negative finite value of float32, bfloat16 and float16 alike, so "
                "the same line is right in every precision.",
                verify="One step under `torch.autocast('cuda', dtype=torch.float16)` runs without the overflow error.",
                location=case.location,
                applies_when="The model may run in float16; in float32/bfloat16-only code the value is harmless.",
            )
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
            Fix(
                title="Drop the scaler for bf16",
                snippet=_BF16_LOOP,
                why="Scaling exists for float16's narrow range; with bf16 it only adds work and a host sync per step.",
                verify="Same loss curve; step time no worse.",
                location=case.location,
            )
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
            Fix(
                title="Close the autocast block before backward",
                snippet="with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n"
                "    loss = criterion(model(x), y)\nloss.backward()   # outside the with-block",
                why="Autocast should cover the forward pass and the loss only.",
                verify="Same gradients; the optimizer step and any clipping run outside autocast.",
                location=case.location,
            )
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
            Fix(
                title="Use the canonical order, once per optimizer step",
                snippet=_FP16_LOOP,
                why="unscale_ records which optimizer's grads it already divided; step() relies on the inf checks "
                "made by unscale_ (or does them itself); update() resets both for the next step.",
                verify="No scaler RuntimeError or AssertionError; scaler.get_scale() evolves over steps.",
                location=case.location,
            ),
            Fix(
                title="With accumulation, unscale and step only on the last micro-step",
                snippet="scaler.scale(loss / accum_steps).backward()\nif (i + 1) % accum_steps == 0:\n"
                "    scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
                "    scaler.step(optimizer)\n    scaler.update()\n    optimizer.zero_grad()",
                why="unscale_ between micro-steps would unscale a partial sum and then fail the second time.",
                verify="One unscale_ / step / update per optimizer step.",
                applies_when="With gradient accumulation.",
            ),
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks the order of scaler calls."],
    )


@SPECIALIST.handles("mixed-precision-setup")
def setup(case: Case) -> Advice:
    return Advice(
        "Choose by hardware: bf16 autocast on Ampere-or-newer GPUs (no scaler), fp16 autocast with a GradScaler on "
        "older ones, and TF32 matmuls for whatever stays in float32.",
        [
            _bf16_fix(),
            _scaler_fix(),
            Fix(
                title="Allow TF32 for float32 matmuls",
                snippet="torch.set_float32_matmul_precision('high')",
                why="'high' lets float32 matmuls use TensorFloat32 tensor cores (10-bit mantissa): large speed-ups "
                "for layers left in float32, with no code change. ('medium' goes further, to bfloat16.)",
                verify="Matmul-heavy steps get faster; the loss curve is unchanged within noise.",
                applies_when="Ampere-or-newer NVIDIA GPUs.",
            ),
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
        [_bf16_fix(), _scaler_fix()],
        [f"`{case.check_cmd('TD4')}` checks the AMP, optimizer and scheduler setup in the source."],
    )

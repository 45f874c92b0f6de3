"""Debugging: NaN/Inf, instability, a model that does not learn, eval-mode and autograd errors."""

from __future__ import annotations

import math

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, gib, listing, sci, secs

SPECIALIST = Specialist("debugging")


def _at_step(case: Case) -> str:
    step = case.step
    return f" at step {step}" if step is not None else ""


def _on_rank(case: Case) -> str:
    rank = case.rank
    return f" on rank {rank}" if rank is not None else ""


def _clip_fix(case: Case) -> Fix:
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


def _lr_fix() -> Fix:
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


def _anomaly_step() -> str:
    return (
        "Reproduce the failing step once under anomaly mode, which names the forward op whose backward produced "
        "the NaN (slow: use it on one step, not for training):\n"
        "with torch.autograd.detect_anomaly():\n    loss = criterion(model(x), y)\n    loss.backward()"
    )


def _guard_fix(module: str | None) -> Fix:
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


@SPECIALIST.handles("nan-loss")
def nan_loss(case: Case) -> Advice:
    module = case.text("first_bad_module")
    phase = case.text("phase")
    lr = case.num("lr")
    where = case.at()
    facts = f"The loss became non-finite{_at_step(case)}{_on_rank(case)}"
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
    guard = _guard_fix(module)
    guard.location = case.location
    fixes = [guard, _clip_fix(case), _lr_fix()]
    if case.has("amp"):
        fixes.append(_fp32_region_fix())
    fixes.append(_input_check_fix())
    return Advice(
        facts,
        fixes,
        [
            f"`{case.run_cmd('nan', extra='--steps 200')}` stops at the first non-finite loss, gradient or "
            "parameter and names the first module that produced it.",
            _anomaly_step(),
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


def _input_check_fix() -> Fix:
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


@SPECIALIST.handles("nonfinite-grad")
def nonfinite_grad(case: Case) -> Advice:
    module = case.text("first_bad_module", "parameter")
    backward_fn = case.text("function")
    facts = f"Gradients contain NaN or Inf{_at_step(case)}{_on_rank(case)}"
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
    guard = _guard_fix(module)
    guard.location = case.location
    return Advice(
        facts,
        [
            guard,
            _clip_fix(case),
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
            _anomaly_step(),
        ],
    )


@SPECIALIST.handles("nonfinite-input")
def nonfinite_input(case: Case) -> Advice:
    field = case.text("field")
    bad = case.num("nonfinite_count")
    batch = case.num("batch_index")
    facts = f"The batch itself contains NaN or Inf{_at_step(case)}"
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
            _input_check_fix(),
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
        facts = f"The total gradient norm reached {sci(norm)}{_at_step(case)}"
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
            _clip_fix(case),
            _lr_fix(),
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
    facts += f"{_at_step(case)}: those layers barely train."
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


def _uniform_classes(loss: float) -> int | None:
    """The n for which loss == ln(n): a classifier predicting a uniform distribution."""
    if loss <= 0.5:
        return None
    n = round(math.exp(loss))
    return n if 2 <= n <= 100_000 and abs(math.log(n) - loss) < 2e-3 else None


@SPECIALIST.handles("loss-not-decreasing")
def not_learning(case: Case) -> Advice:
    first = case.num("loss_first")
    last = case.num("loss_last")
    steps = case.num("steps")
    constant = case.value("constant") is True or (first is not None and last is not None and first == last)
    facts = "The model does not learn."
    if first is not None and last is not None:
        span = f" over {count(steps, 'step')}" if steps is not None else ""
        if constant:
            facts = f"The loss stays exactly at {last:.4f}{span}: no gradient reaches the weights, or the update is zero."
        else:
            facts = f"The loss moves from {first:.4f} to {last:.4f}{span}: barely learning."
        classes = _uniform_classes(last)
        if classes:
            facts += f" {last:.4f} is ln({classes}): the model predicts a uniform distribution over {classes} classes."
    return Advice(
        facts,
        [
            Fix(
                title="Check that every trainable parameter gets a gradient and moves",
                snippet=(
                    "loss.backward()\n"
                    "for name, p in model.named_parameters():\n"
                    "    if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0):\n"
                    "        print('no gradient:', name)"
                ),
                why="A `.detach()`/`.item()`/`.numpy()` in the forward, an optimizer built over another model's "
                "parameters, or frozen layers leave the weights untouched.",
                verify="Every parameter prints a non-zero gradient, and parameters change after optimizer.step().",
                location=case.location,
            ),
            Fix(
                title="Overfit one batch",
                snippet="x, y = next(iter(loader))\nfor _ in range(200):\n    optimizer.zero_grad()\n"
                "    loss = criterion(model(x), y)\n    loss.backward()\n    optimizer.step()\nprint(loss.item())  # should approach 0",
                why="A model that cannot memorise 32 samples has a bug (loss/label pairing, a broken graph, a wrong "
                "output activation), not a tuning problem.",
                verify="The loss on the single batch goes close to zero within a few hundred steps.",
            ),
            Fix(
                title="Feed the loss what it expects",
                snippet="loss = F.cross_entropy(logits, target)   # raw logits, integer class targets\n"
                "loss = F.binary_cross_entropy_with_logits(logit, target.float())",
                why="Softmax before CrossEntropyLoss, or sigmoid before BCELoss, squashes the gradients; "
                "swapped (target, output) arguments train towards nonsense.",
                verify="`torchdoctor check` reports no TD2/TD6 loss findings.",
            ),
            _lr_fix(),
        ],
        [
            f"`{case.check_cmd('TD6')}` looks for eval-mode, loss and graph-cutting mistakes in the source.",
            f"`{case.run_cmd('nan', extra='--steps 50')}` checks that gradients are finite and reach every layer.",
        ],
    )


def _no_grad_fix(case: Case) -> Fix:
    return Fix(
        title="Wrap validation in eval mode and inference mode, then restore train mode",
        snippet=(
            "model.eval()\n"
            "with torch.inference_mode():\n"
            "    for x, y in val_loader:\n"
            "        val_loss += criterion(model(x), y).item()\n"
            "model.train()"
        ),
        why="inference_mode skips graph construction (less memory, faster); eval() switches dropout off and makes "
        "batch norm use its running statistics; train() restores both for the next training step.",
        verify="Validation metrics are identical run to run; validation memory is that of one forward pass.",
        location=case.location,
    )


@SPECIALIST.handles("eval-without-no-grad")
def eval_without_no_grad(case: Case) -> Advice:
    extra = case.num("extra_gib")
    cost = f", costing {gib(extra)} of memory for graphs nobody uses" if extra is not None else ""
    where = case.at("Validation")
    return Advice(
        f"{where} runs its forward passes with grad enabled{cost}.",
        [_no_grad_fix(case)],
        [f"`{case.run_cmd('memory', extra='--steps 20')}` measures memory during the validation passes."],
    )


@SPECIALIST.handles("eval-mode-missing")
def eval_mode_missing(case: Case) -> Advice:
    modules = case.names("modules")
    not_restored = case.value("train_not_restored") is True
    where = case.at("Validation")
    if not_restored:
        facts = f"{where} puts the model in eval mode and training resumes without model.train(): dropout stays off and batch norm stops updating."
    else:
        facts = f"{where} runs with dropout and batch norm still in training mode"
        if modules:
            facts += f" ({listing(modules)})"
        facts += ": metrics are noisy, and batch norm's running statistics are updated with validation data."
    return Advice(
        facts,
        [
            _no_grad_fix(case),
            Fix(
                title="Use a context manager so train mode always comes back",
                snippet=(
                    "from contextlib import contextmanager\n\n"
                    "@contextmanager\n"
                    "def evaluating(model):\n"
                    "    was_training = model.training\n"
                    "    model.eval()\n"
                    "    try:\n"
                    "        yield model\n"
                    "    finally:\n"
                    "        model.train(was_training)"
                ),
                why="An early `return`/`break` in the validation code cannot leave the model in the wrong mode.",
                verify="`model.training` is True at the start of every training step.",
            ),
        ],
        [f"`{case.check_cmd(case.rule_code('TD6'))}` finds validation loops without eval() and missing train()."],
    )


@SPECIALIST.handles("backward-in-validation")
def backward_in_validation(case: Case) -> Advice:
    steps = case.num("eval_mode_forwards")
    where = case.at("The evaluation loop")
    facts = f"{where} runs backward and optimizer.step() on batches it evaluates with the model in eval mode"
    if steps is not None:
        facts += f" ({count(steps, 'forward pass', 'forward passes')} in eval mode whose gradients were applied)"
    facts += ": the model trains on the validation set, and the validation loss is no longer a held-out measure."
    return Advice(
        facts,
        [
            Fix(
                title="Evaluate without backward, step or zero_grad",
                snippet=(
                    "model.eval()\n"
                    "with torch.no_grad():\n"
                    "    for data, target in val_loader:\n"
                    "        loss = criterion(model(data), target)\n"
                    "        running_loss += loss.item()\n"
                    "model.train()"
                ),
                why="Only the training loop may call loss.backward() and optimizer.step(); under no_grad the "
                "evaluation cannot build a graph to step on by mistake.",
                verify="The optimizer's step count per epoch equals the number of training batches.",
                location=case.location,
            ),
        ],
        [f"`{case.check_cmd(case.rule_code('TD6'))}` reads the validation loops statically."],
    )


@SPECIALIST.handles("inplace-modification")
def inplace(case: Case) -> Advice:
    op = case.text("grad_fn", "op")
    version = case.num("version")
    expected = case.num("expected_version")
    shape = case.text("tensor_shape")
    facts = "A tensor autograd saved for backward was modified in place after it was saved"
    if op:
        facts += f" (a {shape} tensor, output of {op}" if shape else f" (it is the output of {op}"
        if version is not None and expected is not None:
            facts += f", now at version {version:.0f} instead of {expected:.0f}"
        facts += ")"
    where = case.at()
    if where:
        facts += f"; the in-place op is at {where}"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="Replace the in-place op with its out-of-place form",
                snippet="x = x + residual          # not x += residual\n"
                "h = torch.relu(h)         # not h.relu_() or nn.ReLU(inplace=True)\n"
                "y = x.clone(); y[mask] = 0   # clone before writing into a saved tensor",
                why="Backward needs the saved value; an in-place write bumps the tensor's version counter and autograd "
                "refuses to use the changed value.",
                verify="backward() runs without the 'modified by an inplace operation' error.",
                location=case.location,
            ),
        ],
        [
            "Run the failing step under anomaly mode: its error adds the traceback of the forward op whose saved "
            "tensor was modified:\nwith torch.autograd.detect_anomaly():\n    loss = criterion(model(x), y)\n    loss.backward()"
        ],
    )


@SPECIALIST.handles("backward-twice")
def backward_twice(case: Case) -> Advice:
    where = case.at()
    facts = "backward() ran through a graph whose saved tensors were already freed by an earlier backward"
    facts += f" (at {where})." if where else "."
    facts += " Usually a tensor from the previous step (a hidden state, a cached embedding, a running loss) is reused."
    return Advice(
        facts,
        [
            Fix(
                title="Cut tensors carried across steps from the previous graph",
                snippet="hidden = hidden.detach()   # at the start of each step",
                why="The carried tensor links this step's graph to last step's, whose buffers were freed after its backward.",
                verify="The error is gone and memory per step stays flat.",
                location=case.location,
            ),
            Fix(
                title="Sum the losses and call backward once",
                snippet="loss = loss_a + loss_b\nloss.backward()",
                why="Two backward calls over a shared graph need retain_graph=True on the first; one call over the sum "
                "gives the same gradients and frees the graph once.",
                verify="A single backward per step; the gradients match the two-call version.",
            ),
            Fix(
                title="retain_graph=True only when two backward passes are really needed",
                snippet="loss_a.backward(retain_graph=True)\nloss_b.backward()",
                why="Keeping the graph keeps all its activations alive until the last backward.",
                verify="Memory per step does not grow.",
                applies_when="Only for genuinely separate backward passes (e.g. a gradient penalty); never as a blanket fix.",
            ),
        ],
        [f"`{case.check_cmd('TD6')}` and `{case.run_cmd('memory', extra='--steps 10')}` show tensors kept across steps."],
    )


@SPECIALIST.handles("device-side-assert")
def device_assert(case: Case) -> Advice:
    where = case.at()
    kernel = case.text("kernel")
    facts = (
        "A CUDA kernel hit an assertion or an illegal address: almost always an index out of range "
        "(a class label >= num_classes or negative in a loss, a token id >= num_embeddings in an embedding)."
    )
    if kernel:
        facts += f" The failing kernel: `{kernel}`."
    if where:
        facts += f" Reported at {where}, but CUDA errors surface asynchronously, often lines later."
    return Advice(
        facts,
        [
            Fix(
                title="Check label and index ranges before they reach the GPU",
                snippet=(
                    "assert 0 <= y.min() and y.max() < num_classes, (y.min().item(), y.max().item())\n"
                    "assert tokens.max() < model.embed.num_embeddings"
                ),
                why="CrossEntropyLoss and nn.Embedding index memory with these values; out-of-range values trip "
                "the kernel's bounds assertion.",
                verify="The assertion passes for a full epoch of the loader.",
                location=case.location,
            ),
            Fix(
                title="Get the real failing line: synchronous kernel launches",
                snippet=f"CUDA_LAUNCH_BLOCKING=1 python {case.script}",
                why="Kernels run asynchronously; with blocking launches the Python traceback points at the op that failed.",
                verify="The traceback now ends at the offending op.",
                applies_when="For debugging only: it makes every launch synchronous and slow.",
            ),
            Fix(
                title="Reproduce on CPU for a readable error",
                snippet="model.cpu(); loss = criterion(model(x.cpu()), y.cpu())",
                why="CPU kernels raise an IndexError with the bad value instead of a device-side assert.",
                verify="The CPU run raises a clear 'index out of range' or 'Target N is out of bounds' message.",
            ),
        ],
        ["After a device-side assert the CUDA context is unusable: restart the process before retrying."],
    )


@SPECIALIST.handles("unstable-log-softmax")
def log_softmax(case: Case) -> Advice:
    where = case.at("The code")
    return Advice(
        f"{where} takes the log of a softmax: probabilities underflow to 0 and their log becomes -inf.",
        [
            Fix(
                title="Use log_softmax, or cross_entropy on the raw logits",
                snippet="logp = F.log_softmax(logits, dim=-1)\n# or, for a classification loss:\nloss = F.cross_entropy(logits, target)",
                why="log_softmax computes x - logsumexp(x) in one stable step; it never forms the tiny probabilities.",
                verify="No -inf/NaN in the log-probabilities for large logits.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD6'))}` finds every such call."],
    )


@SPECIALIST.handles("bce-after-sigmoid")
def bce_after_sigmoid(case: Case) -> Advice:
    where = case.at("The loss")
    return Advice(
        f"{where} applies BCELoss to sigmoid outputs: saturated sigmoids give log(0) and vanishing gradients, and "
        "under autocast BCELoss raises an error.",
        [
            Fix(
                title="Feed the logits to BCEWithLogitsLoss",
                snippet="criterion = nn.BCEWithLogitsLoss()\nloss = criterion(logits, target.float())\n"
                "probs = torch.sigmoid(logits)  # only for metrics / predictions",
                why="It fuses sigmoid and the log-loss with the log-sum-exp trick: stable, and safe to autocast.",
                verify="No NaN loss for large |logits|; same loss value as before where both were finite.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD6'))}` finds every such pair."],
    )


@SPECIALIST.handles("dtype-mismatch")
def dtype_mismatch(case: Case) -> Advice:
    expected = case.text("expected_dtype", "param_dtype", "dtype_b")
    found = case.text("found_dtype", "input_dtype", "dtype_a")
    op_dtype, op = case.text("dtype"), case.text("op")
    facts = "Tensors of different dtypes meet in one operation"
    if expected and found:
        facts += f" ({expected} expected, {found} found)"
    elif op and op_dtype:
        facts = f"`{op}` has no kernel for {op_dtype}"
    where = case.at()
    if where:
        facts += f" at {where}"
    facts += "."
    if "double" in f"{expected or ''} {found or ''}".lower():
        facts += " float64 usually comes from numpy arrays converted with torch.from_numpy / torch.tensor."
    return Advice(
        facts,
        [
            Fix(
                title="Convert inputs once, where they enter",
                snippet="x = torch.from_numpy(array).float()      # numpy defaults to float64\n"
                "y = torch.as_tensor(labels, dtype=torch.long)  # class indices for cross_entropy",
                why="Model parameters are float32; class-index targets must be int64 (long).",
                verify="x.dtype == next(model.parameters()).dtype right before the forward.",
                location=case.location,
            ),
        ],
        ["Print `x.dtype, next(model.parameters()).dtype` right before the failing line."],
    )


@SPECIALIST.handles("hang")
def hang(case: Case) -> Advice:
    seconds = case.num("seconds")
    stuck = case.text("stuck_in")
    where = case.at()
    facts = "The script stopped making progress"
    if seconds is not None:
        facts += f": no optimizer step for {secs(seconds)}"
    if stuck:
        facts += f", blocked in `{stuck}`"
    if where:
        facts += f" at {where}"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="Give DataLoader workers a timeout and rule them out",
                snippet="loader = DataLoader(ds, batch_size=64, num_workers=4, timeout=120)\n"
                "# to test: num_workers=0 runs __getitem__ in the main process",
                why="A worker blocked on I/O, a lock inherited through fork, or a crashed worker leaves the main "
                "process waiting for a batch forever; a timeout turns it into an error.",
                verify="With num_workers=0 the script advances (the hang is in the workers) or not (it is elsewhere).",
                location=case.location,
            ),
            Fix(
                title="Start workers with spawn when the main process uses threads",
                snippet="DataLoader(ds, num_workers=4, multiprocessing_context='spawn')",
                why="fork copies locks held by other threads (logging, tokenizers, OpenMP) in the locked state.",
                verify="The hang no longer reproduces.",
                applies_when="The dataset uses threaded libraries or the main process starts threads before the loader.",
            ),
        ],
        [
            f"`torchdoctor run --hang-timeout 30 {case.script}` dumps every thread's stack when no step completes for 30 s.",
            "`py-spy dump --pid <pid>` shows where a running process is stuck, without stopping it.",
        ],
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


@SPECIALIST.handles("softmax-before-loss")
def softmax_before_loss(case: Case) -> Advice:
    where = case.at("The model")
    return Advice(
        f"{where} feeds probabilities to a loss that applies log-softmax itself: the loss is computed on "
        "softmax(softmax(x)), its gradients shrink, and training plateaus.",
        [
            Fix(
                title="Return logits from forward; let the loss do the softmax",
                snippet="logits = model(x)               # no softmax at the end of forward\n"
                "loss = F.cross_entropy(logits, y)\n"
                "probs = logits.softmax(dim=-1)   # only for predictions",
                why="cross_entropy = log_softmax + nll_loss; softmax applied twice compresses all outputs towards uniform.",
                verify="The loss starts near ln(num_classes) and falls; accuracy rises.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds softmax outputs passed to CrossEntropyLoss."],
    )


@SPECIALIST.handles("device-mismatch")
def device_mismatch(case: Case) -> Advice:
    where = case.at()
    facts = "Tensors on different devices meet in one operation"
    facts += f" at {where}" if where else ""
    facts += ": something was left on the CPU (an input, a tensor attribute of a module, a new tensor made in forward)."
    return Advice(
        facts,
        [
            Fix(
                title="Print the devices right before the failing op",
                snippet="print({n: b.device for n, b in model.named_buffers()}, x.device, next(model.parameters()).device)",
                why="Plain tensor attributes are not moved by model.to(device); only parameters and buffers are.",
                verify="Every tensor in the op is on the same device.",
                location=case.location,
            ),
            Fix(
                title="Create new tensors on the input's device",
                snippet="mask = torch.ones(n, device=x.device)\npos = torch.arange(t, device=x.device)",
                why="torch.ones/arange without device= allocate on the CPU.",
                verify="The forward runs on GPU without a device error.",
            ),
        ],
        [f"`{case.check_cmd('TD2')}` flags tensor attributes that should be registered buffers."],
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
        [_guard_fix(case.text("first_bad_module")), _input_check_fix(), _lr_fix()],
        [f"`{case.run_cmd('nan', extra='--steps 200')}` names the first module producing inf, scaler-aware."],
    )


@SPECIALIST.handles("missing-zero-grad")
def missing_zero_grad(case: Case) -> Advice:
    where = case.at("The training loop")
    return Advice(
        f"{where} never clears gradients, so each step applies the sum of all previous gradients: the effective "
        "learning rate grows every step until the loss diverges.",
        [
            Fix(
                title="Clear gradients once per optimizer step",
                snippet="optimizer.zero_grad()   # sets .grad to None (the default since PyTorch 2.0)\n"
                "loss = criterion(model(x), y)\nloss.backward()\noptimizer.step()",
                why="backward() adds into .grad; without clearing, gradients accumulate across steps.",
                verify="The gradient norm per step stays bounded instead of growing linearly.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks the loop's zero_grad / step order."],
    )


@SPECIALIST.handles("non-differentiable")
def non_differentiable(case: Case) -> Advice:
    params = case.names("parameters")
    where = case.at()
    facts = "The graph is cut before the loss: parameters upstream of the cut receive no gradient"
    if params:
        facts += f" ({listing(params)})"
    if where:
        facts += f"; the cut is at {where}"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="List the parameters left without a gradient after backward",
                snippet="loss.backward()\nprint([n for n, p in model.named_parameters() if p.requires_grad and p.grad is None])",
                why="The names show where the cut is: everything before a .detach(), .item(), .numpy() or an integer op.",
                verify="The list is empty after the fix.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd('TD8')}` finds .detach()/.numpy() inside forward methods."],
    )


@SPECIALIST.handles("index-out-of-range")
def index_out_of_range(case: Case) -> Advice:
    target = case.num("target")
    kernel = case.text("kernel")
    where = case.at()
    facts = "An index is outside its valid range"
    if target is not None:
        facts = f"Target {target:.0f} is out of bounds for the loss"
    elif kernel:
        facts += f" (the `{kernel}` kernel asserted)"
    if where:
        facts += f" at {where}"
    facts += ": a class label >= num_classes (or negative), or a token id >= num_embeddings."
    return Advice(
        facts,
        [
            Fix(
                title="Check label and index ranges on the CPU, before the forward",
                snippet=(
                    "assert 0 <= y.min() and y.max() < num_classes, (y.min().item(), y.max().item())\n"
                    "assert 0 <= tokens.min() and tokens.max() < model.embed.num_embeddings"
                ),
                why="The ranges a loss and an embedding accept are fixed when the layer is built; the data must fit them.",
                verify="The assertions hold for a full pass over the loader.",
                location=case.location,
            ),
            Fix(
                title="Get the real failing line on GPU: synchronous kernel launches",
                snippet=f"CUDA_LAUNCH_BLOCKING=1 python {case.script}",
                why="On CUDA the assert surfaces asynchronously, often lines later; blocking launches pin it to the op.",
                verify="The traceback ends at the embedding or loss call.",
                applies_when="CUDA runs, for debugging only.",
            ),
        ],
        ["Run one step on CPU: CPU kernels raise 'index out of range' / 'Target N is out of bounds' with the value."],
    )


@SPECIALIST.handles("non-scalar-backward")
def non_scalar_backward(case: Case) -> Advice:
    where = case.at()
    facts = "backward() was called on a tensor with more than one element"
    facts += f" at {where}" if where else ""
    facts += ": the loss was not reduced to a scalar (a loss with reduction='none', or a per-sample output)."
    return Advice(
        facts,
        [
            Fix(
                title="Reduce the loss to a scalar before backward",
                snippet="loss = criterion(out, y)          # with reduction='none': shape (batch,)\n"
                "loss = (loss * weights).mean()     # weight per sample, then reduce\nloss.backward()",
                why="backward() without arguments needs a single number to start the chain rule from.",
                verify="loss.dim() == 0 before backward().",
                location=case.location,
            ),
        ],
        [f"`{case.check_cmd('TD6')}` checks the training step; print `loss.shape` right before backward()."],
    )


@SPECIALIST.handles("functional-dropout-always-on")
def functional_dropout(case: Case) -> Advice:
    where = case.at("The forward")
    return Advice(
        f"{where} applies F.dropout without training=self.training, so validation and inference still drop "
        "activations: eval metrics are noisy and lower than they should be.",
        [
            Fix(
                title="Tie dropout to the module's mode",
                snippet="x = F.dropout(x, p=0.1, training=self.training)\n# or an nn.Dropout(0.1) submodule",
                why="F.dropout defaults to training=True; the module form follows model.eval().",
                verify="With model.eval(), repeated forwards on the same input give identical outputs.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds functional dropout calls."],
    )


@SPECIALIST.handles("source-not-analysed")
def source_not_analysed(case: Case) -> Advice:
    reason = case.text("reason")
    where = case.at()
    path = case.location.path if case.location is not None else None
    facts = f"torchdoctor check could not analyse `{path}`" if path else "torchdoctor check could not analyse a file"
    if reason:
        facts += f" ({reason})"
    if where:
        facts += f", at {where}"
    facts += ": none of its rules ran on it."
    return Advice(
        facts,
        [
            Fix(
                title="Make the file parse as Python 3",
                snippet=f"python -m py_compile {path or case.script}",
                why="check reads the source without running it; a syntax error, a non-UTF-8 encoding or NUL bytes stop the parse.",
                verify="py_compile prints nothing and `torchdoctor check` reports findings for the file.",
                location=case.location,
            ),
            Fix(
                title="Or exclude files that are not meant to be analysed",
                snippet="# pyproject.toml\n[tool.torchdoctor]\nexclude = [\"legacy/\", \"generated/*.py\"]",
                why="Generated or Python 2 files are better skipped than reported every run.",
                verify="`torchdoctor check .` no longer lists them.",
                applies_when="For files outside your training code.",
            ),
        ],
        [f"`torchdoctor check {path or case.script}` after the fix."],
    )


_WORKER_CAUSES = {
    "worker-pickle-local": "the dataset, collate_fn or worker_init_fn is a local function or lambda, which "
    "cannot be pickled to start workers with spawn",
    "worker-pickle-lambda": "a lambda cannot be pickled to start workers with spawn",
    "spawn-bootstrap": "the script starts DataLoader workers at import time without an `if __name__ == '__main__':` guard",
    "dataloader-too-many-open-files": "the workers ran out of file descriptors passing tensors through shared memory",
    "dataloader-worker-exception": "__getitem__ or collate_fn raised inside a worker",
}


@SPECIALIST.handles("dataloader-worker-error")
def worker_error(case: Case) -> Advice:
    cause = next((text for src, text in _WORKER_CAUSES.items() if src in case.sources), None)
    exc = case.text("exception")
    worker = case.num("worker_id")
    code = case.num("exit_code")
    facts = "DataLoader workers failed"
    if worker is not None:
        facts = f"DataLoader worker {worker:.0f} failed"
    if exc:
        facts += f" with `{exc}`"
    if code is not None:
        facts += f" (exit code {code:.0f})"
    facts += f": {cause}." if cause else "."
    fixes = [
        Fix(
            title="Reproduce in the main process for a full traceback",
            snippet="loader = DataLoader(ds, batch_size=64, num_workers=0)\nnext(iter(loader))",
            why="With num_workers=0 __getitem__ runs in the main process and its exception shows your line.",
            verify="The error (if it is in your dataset) now points at the line in __getitem__ or collate_fn.",
            location=case.location,
        ),
        Fix(
            title="Use picklable, module-level callables and a main guard",
            snippet=(
                "def collate(batch):            # module level, not a lambda or nested function\n"
                "    return torch.utils.data.default_collate(batch)\n\n"
                "def main():\n"
                "    loader = DataLoader(ds, num_workers=4, collate_fn=collate)\n"
                "    ...\n\n"
                "if __name__ == '__main__':\n"
                "    main()"
            ),
            why="With the spawn start method (macOS, Windows, or multiprocessing_context='spawn') workers re-import the "
            "script and unpickle the dataset and callables.",
            verify="Workers start with num_workers > 0.",
        ),
        Fix(
            title="Share tensors through files when descriptors run out",
            snippet="import torch.multiprocessing\ntorch.multiprocessing.set_sharing_strategy('file_system')",
            why="The default file_descriptor strategy keeps one descriptor per shared tensor.",
            verify="No 'Too many open files' over an epoch.",
            applies_when="The error mentions open files or shared memory.",
        ),
    ]
    if cause and ("pickle" in cause or "guard" in cause):
        fixes.insert(0, fixes.pop(1))
    if cause and "descriptors" in cause:
        fixes.insert(0, fixes.pop())
    return Advice(facts, fixes, [f"`{case.run_cmd('data', extra='--steps 5')}` records each DataLoader's settings and call site."])


@SPECIALIST.handles("cuda-unavailable")
def cuda_unavailable(case: Case) -> Advice:
    driver = case.num("driver_version")
    gpu = case.text("gpu")
    cap = case.text("capability")
    facts = "CUDA cannot be used in this process"
    if "cuda-not-compiled" in case.sources:
        facts = "This torch build has no CUDA support (a CPU-only wheel)"
    elif driver is not None:
        facts = f"The NVIDIA driver (version {driver:.0f}) is too old for this torch build's CUDA runtime"
    elif gpu and cap:
        facts = f"This torch build has no kernels for {gpu} (compute capability {cap})"
    elif "invalid-device-ordinal" in case.sources:
        facts = "The script asks for a GPU index that does not exist in this process (check CUDA_VISIBLE_DEVICES and LOCAL_RANK)"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="Check what torch and the driver see",
                snippet="python -c \"import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())\"",
                why="CPU-only builds report no CUDA version in torch.version.cuda; nvidia-smi shows the driver and the highest CUDA version it supports.",
                verify="torch.cuda.is_available() is True and device_count() matches the GPUs you expect.",
            ),
            Fix(
                title="Install the torch build that matches the GPU and driver",
                snippet="nvidia-smi   # driver version and supported CUDA version",
                why="Pick the CUDA variant of the wheel from pytorch.org's install selector that your driver supports; "
                "very new or very old GPUs need a build that includes their architecture.",
                verify="A tensor moves to the GPU: torch.ones(1).cuda().",
            ),
            Fix(
                title="Fall back cleanly when no GPU is present",
                snippet="device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
                why="Scripts that hard-code 'cuda' fail on CPU-only machines and CI.",
                verify="The script runs on a CPU-only machine.",
                location=case.location,
                applies_when="The script should also run without a GPU.",
            ),
        ],
        [f"`{case.run_cmd('env')}` reports torch, CUDA and driver versions and the visible devices."],
    )


@SPECIALIST.handles("compile-failed")
def compile_failed(case: Case) -> Advice:
    backend = case.text("backend")
    error = case.text("error")
    facts = "torch.compile failed"
    if backend:
        facts += f" in the `{backend}` backend"
    if error:
        facts += f": {error}"
    facts += ". Bisect with simpler backends to see whether tracing or code generation fails."
    return Advice(
        facts,
        [
            Fix(
                title="Bisect the failure by backend",
                snippet="model = torch.compile(model, backend='eager')      # dynamo tracing only\n"
                "model = torch.compile(model, backend='aot_eager')  # + autograd tracing\n"
                "model = torch.compile(model)                       # + inductor code generation",
                why="The first backend that fails names the stage: dynamo, AOTAutograd or inductor (C++ compiler / Triton).",
                verify="The failing stage is identified; the model runs with the previous backend.",
                location=case.location,
            )
        ],
        [f"`TORCHDYNAMO_VERBOSE=1 python {case.script}` prints the full internal traceback of the failure."],
    )


@SPECIALIST.handles("native-crash")
def native_crash(case: Case) -> Advice:
    signal = case.text("signal")
    code = case.num("exit_code")
    after_last = case.value("after_last_step") is True
    where = case.at()
    facts = "The process died of a fatal signal"
    if signal:
        facts = f"The process died of {signal}"
    if code is not None:
        facts += f" (exit code {code:.0f})"
    if case.step is not None:
        facts += f" at step {case.step}"
    if where:
        facts += f"; the last Python frame of yours was {where}"
    if after_last:
        facts += ", after the last training step: the crash is in interpreter or library teardown, not in training"
    facts += ". A native crash bypasses Python's exception handling, so the traceback has to be asked for."
    return Advice(
        facts,
        [
            Fix(
                title="Get the Python stack of every thread at the crash",
                snippet=f"python -X faulthandler {case.script}",
                why="faulthandler prints each thread's Python traceback on SIGSEGV, SIGFPE, SIGABRT, SIGBUS and SIGILL.",
                verify="The crash output now ends with the Python line that called into native code.",
                location=case.location,
            ),
            Fix(
                title="Isolate the native code involved",
                snippet="loader = DataLoader(ds, batch_size=64, num_workers=0)   # rule out worker processes\n"
                "model = model.cpu()                                      # rule out the GPU stack",
                why="Workers forked after CUDA or OpenMP initialisation, extension modules built for another torch, "
                "and GPU drivers are the usual native suspects.",
                verify="The crash disappears with one of them removed, which names the culprit.",
            ),
            Fix(
                title="Check that every native package matches this torch",
                snippet="python -m torch.utils.collect_env",
                why="Extensions (custom CUDA ops, vision/audio packages) compiled against another torch version crash "
                "when loaded together.",
                verify="Companion packages report versions built for the installed torch.",
            ),
        ],
        [f"`{case.run_cmd(extra='--steps 20')}` records the signal, the step and your last frame."],
    )


@SPECIALIST.general
def general(case: Case) -> Advice:
    symptom = case.symptom.title[:1].lower() + case.symptom.title[1:]
    return Advice(
        f"From the debugging side of {symptom}{_at_step(case)}: reproduce it on a small seeded run and find the "
        "first step and module where values go wrong before changing the setup.",
        [_input_check_fix(), _clip_fix(case)],
        [f"`{case.run_cmd('nan', extra='--steps 50')}` checks loss, gradients and parameters every step."],
    )


@SPECIALIST.handles("probe-failed")
def probe_failed(case: Case) -> Advice:
    probe = case.text("probe") or "a"
    error = case.text("error") or "an error"
    at = case.text("at")
    step = case.num("step")
    when = f"at step {int(step)}" if step is not None else "before the first step"
    return Advice(
        f"The {probe} probe failed {when} ({error}) and was switched off: this report says nothing about what it "
        f"measures from then on, so the absence of a {probe} finding is not a clean bill.",
        [
            Fix(
                title=f"Report the {probe} probe's failure; the rest of the report stands",
                snippet=case.run_cmd(probe, extra="--steps 20"),
                why="The failure is torchdoctor's, not your script's: the script ran on unchanged, and the other "
                "probes' findings hold. The error" + (f" and the place it names ({at})" if at else "")
                + " are what a bug report needs; running the probe alone shows whether it reproduces.",
                verify=f"A run lists no probe-failed symptom for the {probe} probe.",
            )
        ],
        [f"`{case.run_cmd(probe)}` runs that probe alone on the same script."],
    )


@SPECIALIST.handles("nothing-measured")
def nothing_measured(case: Case) -> Advice:
    torch_seen = case.value("torch_imported")
    children = case.value("child_processes")
    if children:
        return Advice(
            f"The run measured no training in the script's own process: the script started {children} "
            f"process{'es' if children != 1 else ''} with multiprocessing (`{case.value('child_target')}`, "
            f"{', '.join(case.value('start_methods') or [])}) and the training ran there. torchdoctor's probes live "
            "in the process it starts and in torchrun's ranks, not in processes a script spawns or forks itself, "
            "so this report says nothing about that training either way.",
            [
                Fix(
                    title="Start the ranks with torchrun instead of spawning them from the script",
                    snippet=f"torchdoctor run --nproc-per-node 2 {case.script}   # Lightning: strategy=\"ddp\"\n"
                    f"torchdoctor run {case.script}   # or one process: devices=1 / no mp.spawn",
                    why="Under torchrun every rank runs the probes; Lightning's `ddp` strategy (not `ddp_spawn` or "
                    "`ddp_fork`) and a script that calls init_process_group itself use torchrun's ranks as they are.",
                    verify="The report's Run section counts optimizer steps for every rank.",
                    location=case.location,
                ),
            ],
            [f"`torchdoctor check {case.script}` reads the code without running it."],
        )
    backwards = case.value("backward_passes")
    if backwards:
        facts = (f"The run counted no optimizer step although {backwards} backward pass"
                 f"{'es' if backwards != 1 else ''} ran: the weights were updated without optimizer.step() of a "
                 "torch.optim optimizer (by hand, or by another library's optimizer), so the checks torchdoctor makes "
                 "at each step never ran. This report cannot vouch for that training.")
    elif torch_seen is False:
        facts = ("The run measured nothing: the process torchdoctor watched never imported torch, so no probe "
                 "was attached. A launcher that starts the training in another interpreter (a shell script, "
                 "`subprocess`, `accelerate launch` inside the script) hides it from the probes.")
    else:
        facts = ("The run measured no training: torch was imported, but no optimizer step, backward pass or model "
                 "forward was seen. A clean report from such a run would vouch for training it never watched.")
    return Advice(
        facts,
        [
            Fix(
                title="Point torchdoctor at the process that trains",
                snippet=f"torchdoctor run {case.script} -- <your arguments>\n"
                "torchdoctor run -- torchrun --nproc-per-node 2 train.py   # a torchrun line runs under the probes",
                why="The probes live in the process torchdoctor starts (and, through torchrun, in every rank); "
                "training started anywhere else is invisible to them.",
                verify="The report's Run section counts optimizer steps.",
            ),
            Fix(
                title="Let at least one optimizer step run",
                snippet=f"torchdoctor run --steps 20 {case.script}",
                why="A step is a call of optimizer.step() on a torch.optim optimizer (a framework's own loop calls "
                "it too). A script that only builds the model, or updates weights by hand without an optimizer, "
                "gives the step-based probes nothing to measure.",
                verify="steps_completed in report.json is above 0.",
                applies_when="The script's training loop is behind a flag or a configuration that was not given.",
            ),
        ],
        [f"`torchdoctor check {case.script}` reads the code without running it."],
    )


@SPECIALIST.handles("training-in-validation")
def training_in_validation(case: Case) -> Advice:
    where = case.at("The validation loop")
    data = case.text("variable") or "the validation data"
    return Advice(
        f"{where} updates the model inside the loop over `{data}`: the model trains on the data that is meant "
        "to judge it, so the validation score, early stopping and best-checkpoint choice all read a number "
        "that no longer measures generalisation.",
        [
            Fix(
                title="Drop the update lines and run validation without autograd",
                snippet="@torch.no_grad()\ndef validate(model, val_loader):\n    model.eval()\n"
                "    for x, y in val_loader:\n        loss = criterion(model(x), y)   # no backward, no step",
                why="Validation only reads the model; no_grad also stops autograd from keeping activations.",
                verify="The model's parameters are bit-identical before and after a validation pass.",
                location=case.location,
            )
        ],
        [f"`torchdoctor run --probe validation {case.script}` classifies every forward as trained or evaluation "
         "and reports training forwards that run with the model in eval mode."],
    )


@SPECIALIST.handles("zero-dim-index")
def zero_dim_index(case: Case) -> Advice:
    where = case.at("The script")
    name = case.text("variable") or "loss"
    return Advice(
        f"{where} indexes `{name}`, a 0-dim tensor, as code written before PyTorch 0.4 did: today it raises "
        "'IndexError: invalid index of a 0-dim tensor', usually at the first logging step.",
        [
            Fix(
                title="Read the value with .item()",
                snippet=f"print('loss', {name}.item())",
                why="Reductions return 0-dim tensors since 0.4; .item() returns the Python number.",
                verify="The logging line runs; the printed value matches the loss.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd('TD6')}` finds the other pre-0.4 idioms in the script."],
    )


@SPECIALIST.handles("deprecated-api")
def deprecated_api(case: Case) -> Advice:
    name = case.text("name", "variable")
    new = case.text("replacement")
    state = case.text("state") or "is deprecated"
    warning = case.text("warning")
    where = case.at("The script")
    used = f"`{name}`" if name else "a torch name"
    said = f' (torch says: "{warning}")' if warning else ""
    removed = "removed" in state
    return Advice(
        f"{where} uses {used}, which {state}{said}."
        + (" The call fails at run time." if removed else " It still works, with a warning, until a torch "
           "release removes it."),
        [
            Fix(
                title=f"Replace `{name}` with `{new}`" if name and new else "Move to the API torch's warning names",
                why="The deprecated path is kept only for compatibility: it warns on use, gets no fixes and "
                "disappears in a later release, so the script breaks on a torch upgrade.",
                verify="`python -W error::DeprecationWarning -W error::FutureWarning` runs the script without a "
                "deprecation error, and `torchdoctor check --select TD608` reports nothing.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd('TD608')}` lists every deprecated torch name the script uses."],
    )

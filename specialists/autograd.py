"""Custom autograd functions: torch.autograd.Function, custom backward passes, gradcheck, graph cuts."""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, listing, sci

SPECIALIST = Specialist("autograd")

_GRADCHECK = """\
from torch.autograd import gradcheck

x = torch.randn(4, 3, dtype=torch.double, requires_grad=True)   # double: finite differences need precision
w = torch.randn(3, 5, dtype=torch.double, requires_grad=True)
assert gradcheck(MyFunction.apply, (x, w), eps=1e-6, atol=1e-4)"""

_FUNCTION = """\
class ScaledTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale: float):
        y = torch.tanh(x * scale)
        ctx.save_for_backward(y)        # tensors: save_for_backward
        ctx.scale = scale               # non-tensor values: plain attributes are fine
        return y

    @staticmethod
    def backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        grad_x = grad_y * ctx.scale * (1 - y * y)
        return grad_x, None             # one gradient per forward input; None for the float

out = ScaledTanh.apply(x, 2.0)          # .apply, never ScaledTanh()(x)"""


def _name(case: Case) -> str:
    fn = case.text("function")
    return f"`{fn}`" if fn else "the custom Function"


def _gradcheck_step(case: Case) -> str:
    return (
        f"`{case.run_cmd(extra='--steps 5')}` records each custom Function's inputs and runs "
        "torch.autograd.gradcheck on double-precision copies after the run. By hand:\n" + _GRADCHECK
    )


@SPECIALIST.handles("bad-custom-backward")
def bad_backward(case: Case) -> Advice:
    name = _name(case)
    worst = case.num("max_abs_error")
    arg = case.text("input")
    idx = case.num("input_index")
    expected, got = case.num("expected"), case.num("got")
    where = case.at()
    facts = f"The backward of {name} does not match numerical gradients"
    if expected is not None and got is not None:
        facts = f"The backward of {name} returns {count(got, 'gradient')} for {count(expected, 'forward input')}"
    if arg:
        facts += f" for input `{arg}`"
    elif idx is not None:
        facts += f" for input {idx:.0f}"
    if worst is not None:
        facts += f" (largest absolute error {sci(worst)})"
    if where:
        facts += f"; backward is defined at {where}"
    facts += "."
    count_bad = (expected is not None and got is not None and expected != got)
    fixes = []
    if count_bad:
        fixes.append(_count_fix(case))
    fixes += [
        Fix(
            title="Derive each gradient against its forward input and test it with gradcheck",
            snippet=_GRADCHECK,
            why="gradcheck compares your backward with finite differences on every input element; in double "
            "precision a correct backward passes with atol=1e-4.",
            verify="gradcheck returns True; it fails loudly (with the mismatching Jacobian) otherwise.",
            location=case.location,
        ),
        Fix(
            title="Reduce broadcast gradients back to the input's shape",
            snippet="grad_b = grad_out.sum(dim=0)                # b was broadcast over the batch\n"
            "grad_b = grad_out.sum_to_size(b.shape)      # general form",
            why="When forward broadcasts an input, its gradient must be summed over the broadcast dimensions; "
            "returning the broadcast shape is wrong (or raises).",
            verify="Each returned gradient has the shape of its input.",
            applies_when="A forward input is broadcast (biases, scales).",
        ),
    ]
    if not count_bad:
        fixes.append(_count_fix(case))
    return Advice(facts, fixes, [_gradcheck_step(case)])


def _count_fix(case: Case) -> Fix:
    return Fix(
        title="Return exactly one gradient per forward input",
        snippet="@staticmethod\ndef backward(ctx, grad_out):\n    x, w = ctx.saved_tensors\n"
        "    return grad_out @ w.T, x.T @ grad_out, None   # None for the non-tensor argument",
        why="autograd matches backward's return values to forward's inputs by position; a missing or extra "
        "entry raises 'returned an incorrect number of gradients'.",
        verify="backward() runs; gradcheck passes.",
        location=case.location,
    )


@SPECIALIST.handles("non-differentiable")
def non_differentiable(case: Case) -> Advice:
    op = case.text("op") or ("numpy()" if "numpy-requires-grad" in case.sources else None)
    params = case.names("parameters")
    where = case.at("The forward")
    facts = f"{where} cuts the autograd graph"
    if op:
        facts += f" with `{op}`"
    if "no-grad-fn" in case.sources:
        facts = f"{where}: backward was called on a tensor that does not require grad, so the graph was cut before it"
    facts += ": nothing upstream of the cut receives a gradient"
    if params:
        facts += f" ({listing(params)})"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="Keep the computation in differentiable torch ops",
                snippet="y = torch.clamp(x, 0, 1)       # not torch.tensor(np.clip(x.detach().numpy(), 0, 1))\n"
                "y = torch.round(x)              # gradient is zero almost everywhere: see the estimator below",
                why=".detach(), .numpy(), .item(), torch.tensor(...) on existing values and integer casts produce "
                "tensors without a grad_fn.",
                verify="The output has a grad_fn, and parameters before it get non-zero gradients.",
                location=case.location,
            ),
            Fix(
                title="Give a non-differentiable step a straight-through gradient",
                snippet="y = x + (torch.round(x) - x).detach()   # forward: round(x); backward: identity",
                why="Quantisation, argmax and sampling have zero or undefined gradients; the straight-through "
                "estimator passes the gradient through unchanged.",
                verify="Upstream parameters receive gradients of the expected size.",
                applies_when="The forward must stay non-differentiable (quantisation, hard choices).",
            ),
            Fix(
                title="Or write the gradient yourself in an autograd.Function",
                snippet=_FUNCTION,
                why="A custom Function lets forward use anything (even numpy) while backward supplies the gradient.",
                verify="gradcheck passes on double-precision inputs.",
                applies_when="A correct analytical gradient exists.",
            ),
        ],
        [
            f"`{case.check_cmd(case.rule_code('TD8'))}` finds .detach()/.numpy()/.item() inside forward methods.",
            "After backward: `[n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]` names what the cut starves.",
        ],
    )


@SPECIALIST.handles("ctx-misuse")
def ctx_misuse(case: Case) -> Advice:
    attr = case.text("attribute")
    where = case.at()
    stash = f"`ctx.{attr}`" if attr else "an attribute of ctx"
    facts = f"{_name(case)} keeps a tensor in {stash} instead of ctx.save_for_backward"
    if where:
        facts += f" ({where})"
    facts += (
        ": autograd then cannot detect in-place changes to it (silently wrong gradients), saving an output this "
        "way creates a reference cycle that leaks memory, and saved-tensor hooks (offloading, checkpointing) skip it."
    )
    return Advice(
        facts,
        [
            Fix(
                title="Save tensors with ctx.save_for_backward, read them from ctx.saved_tensors",
                snippet="ctx.save_for_backward(x, y)\n...\nx, y = ctx.saved_tensors",
                why="Saved tensors carry version checks and are freed with the graph; non-tensor values may stay plain attributes.",
                verify="Memory per step stays flat; modifying a saved tensor in place now raises instead of corrupting gradients.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD8'))}` lists tensors assigned to ctx attributes.", _gradcheck_step(case)],
    )


@SPECIALIST.handles("function-called-directly")
def called_directly(case: Case) -> Advice:
    where = case.at()
    facts = f"{_name(case)} is instantiated and called (or its forward called) instead of going through .apply"
    if where:
        facts += f" at {where}"
    facts += (
        ": PyTorch 2.13 raises 'Legacy autograd function with non-static forward method is deprecated' for "
        "Function()(x), and calling .forward() directly bypasses your backward altogether."
    )
    return Advice(
        facts,
        [
            Fix(
                title="Call the class's apply",
                snippet="y = MyFunction.apply(x, w)\n# inside a module:\nclass MyLayer(nn.Module):\n"
                "    def forward(self, x):\n        return MyFunction.apply(x, self.weight)",
                why="apply records the Function as one node in the graph so that backward calls your backward.",
                verify="y.grad_fn is a MyFunctionBackward node.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD8'))}` finds direct calls of Function classes."],
    )


@SPECIALIST.handles("reentrant-checkpoint")
def reentrant_checkpoint(case: Case) -> Advice:
    where = case.at("torch.utils.checkpoint.checkpoint")
    return Advice(
        f"{where} is called without use_reentrant: PyTorch 2.13 warns and uses the reentrant variant, which runs "
        "the forward under no_grad, supports only plain .backward() (not torch.autograd.grad or backward(inputs=...)), "
        "and gives no gradients when no input requires grad.",
        [
            Fix(
                title="Pass use_reentrant=False",
                snippet="from torch.utils.checkpoint import checkpoint\n\nx = checkpoint(self.block, x, use_reentrant=False)",
                why="The non-reentrant variant records the graph, so parameters inside the block get gradients even "
                "when its inputs do not require grad, and every way of calling backward works.",
                verify="No use_reentrant warning; block parameters have gradients after backward.",
                location=case.location,
            ),
            Fix(
                title="Keep use_reentrant=True only on purpose",
                snippet="x = checkpoint(self.block, x, use_reentrant=True)   # explicit, documented choice",
                why="Explicit is required to silence the warning; the reentrant variant has the limits above.",
                verify="The inputs of every checkpointed block require grad.",
                applies_when="Only for code that depends on the reentrant variant's behaviour; every block input must require grad.",
            ),
        ],
        [f"`{case.check_cmd(case.rule_code('TD8'))}` finds checkpoint calls without use_reentrant."],
    )


@SPECIALIST.handles("custom-function")
def custom_function(case: Case) -> Advice:
    return Advice(
        "A custom autograd.Function is a pair of static methods: forward computes and saves what backward needs, "
        "backward returns one gradient per forward input; check it with gradcheck before training with it.",
        [
            Fix(
                title="Write the Function with static methods and save_for_backward",
                snippet=_FUNCTION,
                why="This is the form autograd expects: static methods, tensors saved through ctx, apply to call it.",
                verify="out.grad_fn is a ScaledTanhBackward node; gradcheck passes.",
            ),
            Fix(
                title="Verify with gradcheck in double precision",
                snippet=_GRADCHECK,
                why="Finite differences catch sign errors, missing chain-rule factors and broadcast mistakes.",
                verify="gradcheck returns True.",
            ),
            Fix(
                title="Mark what cannot be differentiated twice",
                snippet="from torch.autograd.function import once_differentiable\n\n"
                "class MyFunction(torch.autograd.Function):\n"
                "    @staticmethod\n"
                "    @once_differentiable\n"
                "    def backward(ctx, grad_out):\n"
                "        ...",
                why="If backward uses non-differentiable operations, double backward (gradient penalties, Hessians) "
                "would silently be wrong; the decorator makes it raise instead.",
                verify="Calling torch.autograd.grad(..., create_graph=True) through it raises a clear error.",
                applies_when="Backward is not itself written in differentiable torch ops.",
            ),
        ],
        [_gradcheck_step(case)],
    )


@SPECIALIST.handles("inplace-modification")
def inplace(case: Case) -> Advice:
    where = case.at()
    return Advice(
        "From the autograd side: a tensor saved for backward changed version between forward and backward"
        + (f" ({where})" if where else "")
        + "; in a custom Function, this is also what ctx.save_for_backward protects against.",
        [
            Fix(
                title="Modify a copy, or mark in-place outputs of a custom Function",
                snippet="y = x.clone()\ny.mul_(2)\n# inside a custom Function that writes into its input:\nctx.mark_dirty(x)",
                why="Autograd tracks a version counter per tensor; clone gives a fresh one, mark_dirty tells autograd "
                "the input was modified on purpose.",
                verify="backward() runs and gradcheck passes.",
                location=case.location,
            )
        ],
        ["Run the failing step under `torch.autograd.detect_anomaly()` to get the forward traceback of the op."],
    )


@SPECIALIST.handles("backward-twice")
def backward_twice(case: Case) -> Advice:
    return Advice(
        "From the autograd side: saved tensors are freed after the first backward through a graph; a custom "
        "Function's ctx.saved_tensors are freed the same way.",
        [
            Fix(
                title="Recompute or detach instead of retaining the graph",
                snippet="state = state.detach()   # start each step's graph fresh",
                why="retain_graph=True keeps every saved activation alive until the last backward.",
                verify="One backward per graph; memory per step stays flat.",
                location=case.location,
            )
        ],
        ["`torch.autograd.detect_anomaly()` around the second backward shows which forward op's buffers were freed."],
    )


@SPECIALIST.handles("non-scalar-backward")
def non_scalar(case: Case) -> Advice:
    return Advice(
        "From the autograd side: backward() without arguments starts from a scalar; for a non-scalar output it "
        "needs the vector to multiply the Jacobian with.",
        [
            Fix(
                title="Reduce to a scalar, or pass the output gradient explicitly",
                snippet="loss.mean().backward()\n# vector-Jacobian product on purpose:\nout.backward(gradient=torch.ones_like(out))",
                why="backward computes vᵀJ; for a scalar v is 1, otherwise you must say what v is.",
                verify="backward() runs and .grad holds the intended quantity.",
                location=case.location,
            )
        ],
        ["Print `loss.shape` right before backward(): it should be torch.Size([])."],
    )


@SPECIALIST.general
def general(case: Case) -> Advice:
    symptom = case.symptom.title[:1].lower() + case.symptom.title[1:]
    return Advice(
        f"From the autograd side of {symptom}: check custom Functions with gradcheck and make sure no op in the "
        "forward cuts the graph.",
        [
            Fix(
                title="Verify custom gradients with gradcheck",
                snippet=_GRADCHECK,
                why="A wrong custom backward trains towards the wrong point without any error.",
                verify="gradcheck returns True for every custom Function.",
            )
        ],
        [_gradcheck_step(case)],
    )

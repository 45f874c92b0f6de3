"""Custom autograd functions: torch.autograd.Function, custom backward passes, gradcheck, graph cuts.

The fixes themselves are data (rules/data/advice/autograd.toml); this module decides which apply,
in which order, and which line each is pinned to.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, listing, sci

SPECIALIST = Specialist("autograd")


def _name(case: Case) -> str:
    fn = case.text("function")
    return f"`{fn}`" if fn else "the custom Function"


def _gradcheck_step(case: Case) -> str:
    return (
        f"`{case.run_cmd(extra='--steps 5')}` records each custom Function's inputs and runs "
        "torch.autograd.gradcheck on double-precision copies after the run. By hand:\n"
        + advice.snippet("autograd", "gradcheck")
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
        advice.fix("autograd", "derive-and-gradcheck", location=case.location),
        advice.fix("autograd", "reduce-broadcast-gradients"),
    ]
    if not count_bad:
        fixes.append(_count_fix(case))
    return Advice(facts, fixes, [_gradcheck_step(case)])


def _count_fix(case: Case) -> Fix:
    return advice.fix("autograd", "one-gradient-per-input", location=case.location)


@SPECIALIST.handles("non-differentiable")
def non_differentiable(case: Case) -> Advice:
    if case.text("detached_from") is not None:  # run measured one term of the loss cut off, not the whole graph
        return _detached_term(case)
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
            advice.fix("autograd", "differentiable-ops", location=case.location),
            advice.fix("autograd", "straight-through"),
            advice.fix("autograd", "write-a-function"),
        ],
        [
            f"`{case.check_cmd(case.rule_code('TD8'))}` finds .detach()/.numpy()/.item() inside forward methods.",
            "After backward: `[n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]` names what the cut starves.",
        ],
    )


def _detached_term(case: Case) -> Advice:
    """One term of the loss computed from a detached tensor: the rest of the loss still trains the parameters,
    so "nothing upstream receives a gradient" would be false; the term itself trains nothing behind the cut."""
    where = case.at("A line of the loss")
    through = case.text("through")
    reached = case.num("parameters_reached")
    behind = f"the {count(reached, 'parameter')}" if reached else "the parameters"
    if through:
        facts = (f"{where} feeds a detached tensor through `{through}`, a network the optimizer stepping next does "
                 f"not train: the loss term it gives sends no gradient back to {behind} the tensor was cut from. "
                 "The other terms of the loss still train them, so the loss falls while this term does nothing "
                 "(a generator loss computed on D(fake.detach()) is the usual case).")
        fixes = [advice.fix("autograd", "detach-only-for-the-other-network", location=case.location)]
    else:
        facts = (f"{where} adds a term computed from a detached tensor (detach(), .data, .item()) to the loss: it "
                 f"counts in the loss value but trains none of {behind} it was cut from; the rest of the loss "
                 "still does.")
        fixes = [advice.fix("autograd", "keep-the-term-attached", location=case.location)]
        fixes.append(advice.fix("autograd", "straight-through"))  # a deliberate hard step may want a gradient
    return Advice(
        facts,
        fixes,
        ["After loss.backward(), compare one parameter's .grad with the term and without it: equal means the "
         "term trains nothing."],
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
            advice.fix("autograd", "save-for-backward", location=case.location)
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
            advice.fix("autograd", "call-apply", location=case.location)
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
            advice.fix("autograd", "use-reentrant-false", location=case.location),
            advice.fix("autograd", "use-reentrant-true-on-purpose"),
        ],
        [f"`{case.check_cmd(case.rule_code('TD8'))}` finds checkpoint calls without use_reentrant."],
    )


@SPECIALIST.handles("custom-function")
def custom_function(case: Case) -> Advice:
    return Advice(
        "A custom autograd.Function is a pair of static methods: forward computes and saves what backward needs, "
        "backward returns one gradient per forward input; check it with gradcheck before training with it.",
        [
            advice.fix("autograd", "function-template"),
            advice.fix("autograd", "gradcheck-double"),
            advice.fix("autograd", "once-differentiable"),
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
            advice.fix("autograd", "copy-or-mark-dirty", location=case.location)
        ],
        ["Run the failing step under `torch.autograd.detect_anomaly()` to get the forward traceback of the op."],
    )


@SPECIALIST.handles("backward-twice")
def backward_twice(case: Case) -> Advice:
    return Advice(
        "From the autograd side: saved tensors are freed after the first backward through a graph; a custom "
        "Function's ctx.saved_tensors are freed the same way.",
        [
            advice.fix("autograd", "detach-not-retain", location=case.location)
        ],
        ["`torch.autograd.detect_anomaly()` around the second backward shows which forward op's buffers were freed."],
    )


@SPECIALIST.handles("non-scalar-backward")
def non_scalar(case: Case) -> Advice:
    return Advice(
        "From the autograd side: backward() without arguments starts from a scalar; for a non-scalar output it "
        "needs the vector to multiply the Jacobian with.",
        [
            advice.fix("autograd", "scalar-or-gradient", location=case.location)
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
            advice.fix("autograd", "verify-gradcheck")
        ],
        [_gradcheck_step(case)],
    )

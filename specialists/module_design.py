"""Module and model design: nn.Module structure, registration, forward design, shapes, devices.

The fixes themselves are data (rules/data/advice/module-design.toml); this module decides which
apply, in which order, and which line each is pinned to.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, listing

SPECIALIST = Specialist("module-design")


def _shape(dims: list[int]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


def _shape_facts(case: Case) -> tuple[str, int | None]:
    """What the evidence says about the mismatch, and the in_features a Linear should have (if known)."""
    m1, m2 = case.dims("mat1_shape"), case.dims("mat2_shape")
    if len(m1) == 2 and len(m2) == 2 and m1[1] != m2[0]:
        return (
            f": a matmul of {_shape(m1)} by {_shape(m2)} — the layer expects {m2[0]} input features but receives "
            f"{m1[1]}. Set in_features={m1[1]}, or fix the flatten/reshape that feeds it.",
            m1[1],
        )
    exp_c, got_c = case.num("expected_channels"), case.num("got_channels")
    if exp_c is not None and got_c is not None:
        return f": the convolution expects {exp_c:.0f} input channels but receives {got_c:.0f}.", None
    exp_f, got_f = case.num("expected_features"), case.num("got_features")
    if exp_f is not None and got_f is not None:
        return f": the recurrent layer expects input_size={exp_f:.0f} but receives {got_f:.0f} features.", None
    in_b, tgt_b = case.num("input_batch"), case.num("target_batch")
    if in_b is not None and tgt_b is not None:
        return (
            f": the model's output has batch size {in_b:.0f} but the target has {tgt_b:.0f} — usually a reshape "
            "that folded the batch into another dimension.",
            None,
        )
    size_a, size_b, dim = case.num("size_a"), case.num("size_b"), case.num("dim")
    if size_a is not None and size_b is not None:
        at_dim = f" at dimension {dim:.0f}" if dim is not None else ""
        return f": sizes {size_a:.0f} and {size_b:.0f} cannot broadcast{at_dim}.", None
    exp_s, got_s = case.num("expected_size"), case.num("got_size")
    if exp_s is not None and got_s is not None:
        return f": tensors to concatenate have size {got_s:.0f} where {exp_s:.0f} is expected.", None
    target, numel = case.dims("target_shape"), case.num("numel")
    if target and numel is not None:
        return f": a view to {_shape(target)} of a tensor with {numel:.0f} elements.", None
    a, b = case.dims("shape_a"), case.dims("shape_b")
    if a and b:
        return f": {_shape(a)} against {_shape(b)}.", None
    return ": write the expected shape next to each step of forward and check it with a dummy batch.", None


@SPECIALIST.handles("shape-mismatch")
def shape_mismatch(case: Case) -> Advice:
    if case.sources & {"stack-unequal", "storage-not-resizable"}:
        return _unequal_samples(case)
    module = case.text("module")
    where = case.at()
    facts = "Tensor shapes do not fit"
    if module:
        facts += f" in `{module}`"
    if where:
        facts += f" at {where}"
    detail, known = _shape_facts(case)
    facts += detail
    in_features = known if known is not None else "in_features"  # the snippet names the argument when unknown
    return Advice(
        facts,
        [
            advice.fix("module-design", "match-layer-to-input", location=case.location, in_features=in_features),
            advice.fix("module-design", "flatten-features"),
            advice.fix("module-design", "assert-shapes"),
        ],
        [
            "Print every submodule's output shape for one dummy batch:\n"
            "for name, m in model.named_modules():\n"
            "    m.register_forward_hook(lambda mod, i, o, name=name: print(name, tuple(o.shape)) if torch.is_tensor(o) else None)\n"
            "model(torch.zeros(2, *input_shape))",
        ],
    )


def _unequal_samples(case: Case) -> Advice:
    """torch.stack of samples with different shapes: almost always the DataLoader's default collate_fn
    batching variable-size samples, so the fix is in the batching, not in any layer's in_features."""
    shape_a, shape_b = case.dims("shape_a"), case.dims("shape_b")
    where = case.at()
    facts = "torch.stack got samples of different shapes"
    if shape_a and shape_b:
        facts += f" ({_shape(shape_a)} and {_shape(shape_b)})"
    if where:
        facts += f" at {where}"
    facts += (
        ": the DataLoader's collate_fn stacks the samples of a batch into one tensor, so variable-length "
        "sequences, images of different sizes or a varying number of boxes per image cannot be batched as they are."
    )
    return Advice(
        facts,
        [
            advice.fix("module-design", "pad-collate", location=case.location),
            advice.fix("module-design", "list-targets"),
            advice.fix("module-design", "one-size-samples"),
        ],
        ["Print the shapes of a few samples: `print([tuple(dataset[i][0].shape) for i in range(8)])`."],
    )


@SPECIALIST.handles("unregistered-parameters")
def unregistered(case: Case) -> Advice:
    attr = case.text("attribute")
    where = case.at("The module")
    what = f"`{attr}`" if attr else "submodules or parameters"
    facts = (
        f"{where} keeps {what} in a plain Python list or dict: they are not registered, so model.parameters() (and "
        "so the optimizer), .to(device), state_dict() and DDP never see them."
    )
    if "optimizer-empty-params" in case.sources:
        facts = (
            "The optimizer got an empty parameter list: the model registered no parameters, usually because its "
            "layers sit in a plain list or dict, or __init__ never called super().__init__()."
        )
    return Advice(
        facts,
        [
            advice.fix("module-design", "registering-containers", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds modules and parameters held in lists or dicts."],
    )


@SPECIALIST.handles("frozen-parameters")
def frozen(case: Case) -> Advice:
    params = case.names("parameters")
    n = case.num("count")
    facts = "Some parameters never receive a gradient although they should"
    if params:
        facts = f"{listing(params)} never receive a gradient"
    elif n is not None:
        facts = f"{count(n, 'parameter')} never receive a gradient"
    where = case.at()
    if where:
        facts += f" (see {where})"
    facts += ": they are frozen (requires_grad=False), missing from the optimizer, or cut off from the loss."
    return Advice(
        facts,
        [
            advice.fix("module-design", "unfreeze-and-rebuild-optimizer", location=case.location),
            advice.fix("module-design", "find-graph-cut"),
        ],
        [f"`{case.run_cmd('nan', extra='--steps 5')}` lists parameters without gradients after backward."],
    )


@SPECIALIST.handles("freeze-layers")
def freeze_layers(case: Case) -> Advice:
    return Advice(
        "To freeze part of a model, its parameters stop requiring gradients, the optimizer gets only what still "
        "trains, and its BatchNorm layers stop updating their running statistics (requires_grad alone does not "
        "stop those).",
        [
            advice.fix("module-design", "freeze-backbone", location=case.location),
            advice.fix("module-design", "frozen-batchnorm-eval"),
            advice.fix("module-design", "unfreeze-later"),
        ],
        ["Print what trains: `print([n for n, p in model.named_parameters() if p.requires_grad])`."],
    )


@SPECIALIST.handles("forward-called-directly")
def forward_direct(case: Case) -> Advice:
    where = case.at("The code")
    return Advice(
        f"{where} calls .forward() directly: that skips nn.Module.__call__, and with it every forward pre/post hook "
        "(FSDP's parameter gathering, pruning and quantisation hooks, torchdoctor's own probes).",
        [
            advice.fix("module-design", "call-the-module", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds .forward( calls from outside the module."],
    )


@SPECIALIST.handles("missing-super-init")
def missing_super(case: Case) -> Advice:
    cls = case.text("variable")  # TD203 names the class
    where = case.at("The module's __init__")
    name = f"`{cls}`" if cls else "An nn.Module subclass"
    return Advice(
        f"{name} ({where}) does not call super().__init__(): assigning a submodule or parameter raises "
        "'cannot assign module before Module.__init__() call', and nothing gets registered.",
        [
            advice.fix("module-design", "super-init-first", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` checks every nn.Module subclass."],
    )


@SPECIALIST.handles("unregistered-buffer")
def unregistered_buffer(case: Case) -> Advice:
    attr = case.text("attribute")
    where = case.at("The module")
    what = f"`{attr}`" if attr else "a tensor attribute"
    return Advice(
        f"{where} stores {what} as a plain tensor attribute: model.to(device) does not move it (a device mismatch "
        "on GPU) and state_dict() does not save it.",
        [
            advice.fix("module-design", "register-buffer", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds tensor attributes assigned in __init__."],
    )


@SPECIALIST.handles("softmax-before-loss")
def softmax_loss(case: Case) -> Advice:
    where = case.at("The model")
    return Advice(
        f"{where} applies softmax before a loss that expects logits (CrossEntropyLoss applies log_softmax itself): "
        "the loss sees softmax twice and its gradients shrink.",
        [
            advice.fix("module-design", "return-logits", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds softmax outputs passed to CrossEntropyLoss."],
    )


@SPECIALIST.handles("log-softmax-before-cross-entropy")
def log_softmax_loss(case: Case) -> Advice:
    where = case.at("The model")
    return Advice(
        f"{where} applies log_softmax before a cross-entropy loss that applies log_softmax itself: the loss and its "
        "gradients are unchanged, but the extra pass and its saved activation are wasted.",
        [
            advice.fix("module-design", "return-logits", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds log_softmax outputs passed to CrossEntropyLoss."],
    )


def _sdpa_fix(case: Case) -> Fix:
    return advice.fix("module-design", "sdpa", location=case.location)


@SPECIALIST.handles("manual-attention")
def manual_attention(case: Case) -> Advice:
    where = case.at("The attention code")
    return Advice(
        f"{where} spells out softmax(q @ kᵀ) @ v: the full attention matrix is stored for backward and the "
        "fused attention kernels are never used.",
        [_sdpa_fix(case)],
        [f"`{case.run_cmd('profile', extra='--steps 20')}` shows attention's share of the step before and after."],
    )


@SPECIALIST.handles("model-structure")
def model_structure(case: Case) -> Advice:
    return Advice(
        "Structure a model as nn.Module subclasses: submodules created in __init__ (after super().__init__()), "
        "shapes documented in forward, weights initialised once, and the loss kept outside the model.",
        [
            advice.fix("module-design", "module-skeleton"),
            advice.fix("module-design", "tiny-batch-test"),
        ],
        [f"`{case.check_cmd('TD2')}` checks module structure: registration, super().__init__, buffers, loss inputs."],
    )


def _vectorise_fix(case: Case) -> Fix:
    return advice.fix("module-design", "vectorise-layer", location=case.location)


@SPECIALIST.handles("slow-custom-layer")
def slow_custom_layer(case: Case) -> Advice:
    name = case.text("module")
    facts = f"The custom layer `{name}`" if name else "The custom layer"
    where = case.at()
    if where:
        facts += f" ({where})"
    facts += ": slow custom layers are usually a design problem — Python loops, per-element ops, host syncs or CPU tensors created in forward."
    return Advice(
        facts,
        [
            _vectorise_fix(case),
            advice.fix("module-design", "builtin-fused-ops"),
            advice.fix("module-design", "no-syncs-in-forward"),
        ],
        [f"`{case.run_cmd('profile', extra='--steps 20')}` attributes time per operator; wrap the layer in "
         "`torch.profiler.record_function('MyLayer')` to see its total."],
    )


@SPECIALIST.handles("device-mismatch")
def device_mismatch(case: Case) -> Advice:
    a = case.text("device_a", "input_type")
    b = case.text("device_b", "weight_type")
    arg = case.text("argument")
    where = case.at()
    facts = "Tensors on different devices meet in one op"
    if a and b:
        facts += f" ({a} and {b}"
        facts += f", argument `{arg}`)" if arg else ")"
    if where:
        facts += f" at {where}"
    facts += ": a tensor attribute, a tensor created in forward, or an input was not moved with the model."
    return Advice(
        facts,
        [
            advice.fix("module-design", "buffers-for-constants", location=case.location),
            advice.fix("module-design", "create-on-input-device"),
            advice.fix("module-design", "move-batches"),
        ],
        [f"`{case.check_cmd('TD2')}` flags tensor attributes that should be registered buffers."],
    )


@SPECIALIST.handles("unused-parameters")
def unused(case: Case) -> Advice:
    params = case.names("parameters")
    what = listing(params) if params else "Some parameters"
    return Advice(
        f"From the model's side: {what} take no part in the loss on some steps. Decide whether they should: remove "
        "dead submodules, or make every branch run (or freeze what a phase does not train).",
        [
            advice.fix("module-design", "dead-parameters", location=case.location)
        ],
        [f"`{case.run_cmd(extra='--steps 5')}` lists parameters without gradients after backward."],
    )


@SPECIALIST.handles("dtype-mismatch")
def dtype(case: Case) -> Advice:
    return Advice(
        "From the model's side: keep parameters and buffers in one dtype (cast the module with .to(dtype), which "
        "also converts registered buffers) and convert inputs at the model's boundary.",
        [
            advice.fix("module-design", "cast-inputs", location=case.location)
        ],
        [f"`{case.check_cmd('TD2')}` flags tensor attributes that should be registered buffers."],
    )


@SPECIALIST.handles("functional-dropout-always-on")
def functional_dropout(case: Case) -> Advice:
    where = case.at("The forward")
    return Advice(
        f"{where} calls F.dropout without training=self.training: the functional form defaults to training=True, "
        "so dropout stays on after model.eval() and validation and inference outputs are randomly perturbed.",
        [
            advice.fix("module-design", "dropout-module", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds functional dropout calls without training=."],
    )


@SPECIALIST.handles("index-out-of-range")
def index_range(case: Case) -> Advice:
    target = case.num("target")
    where = case.at()
    facts = "An index or class label is outside the range a layer was built for"
    if target is not None:
        facts = f"A target value of {target:.0f} is outside the loss's class range"
    if where:
        facts += f" ({where})"
    facts += ": size the layer from the data, not the other way round."
    return Advice(
        facts,
        [
            advice.fix("module-design", "size-layers-from-data", location=case.location),
            advice.fix("module-design", "ignore-index"),
        ],
        [f"`{case.check_cmd('TD2')}` checks layer construction; run once on CPU for a readable index error."],
    )


_SPEED = {"slow-step", "low-gpu-util", "launch-bound", "host-sync"}


@SPECIALIST.general
def general(case: Case) -> Advice:
    symptom = case.symptom.title[:1].lower() + case.symptom.title[1:]
    if case.symptom.id in _SPEED:
        return Advice(
            f"From the design side of {symptom}: a slow custom layer is usually its structure — Python loops, "
            "per-element ops, host syncs — so fix that before profiling the rest.",
            [_vectorise_fix(case)],
            [f"`{case.run_cmd('profile', extra='--steps 20')}` attributes the step's time to operators."],
        )
    return Advice(
        f"From the design side of {symptom}: check that every submodule, parameter and constant tensor is registered "
        "and that forward is called through the module.",
        [
            advice.fix("module-design", "dummy-batch-check")
        ],
        [f"`{case.check_cmd('TD2')}` checks the module code."],
    )

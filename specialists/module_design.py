"""Module and model design: nn.Module structure, registration, forward design, shapes, devices."""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, listing

SPECIALIST = Specialist("module-design")

_SKELETON = """\
class Classifier(nn.Module):
    \"\"\"x: (batch, channels, height, width) -> logits: (batch, num_classes)\"\"\"

    def __init__(self, num_classes: int, width: int = 64):
        super().__init__()                      # first: sets up parameter/submodule registries
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(width, num_classes)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x).flatten(1)         # (batch, width)
        return self.head(h)                     # logits; the loss lives outside the model"""


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
    detail, in_features = _shape_facts(case)
    facts += detail
    return Advice(
        facts,
        [
            Fix(
                title="Match the layer to its input (or infer it)",
                snippet=(
                    f"self.head = nn.Linear({in_features if in_features is not None else 'in_features'}, num_classes)\n"
                    "# or let PyTorch infer in_features on the first forward:\n"
                    "self.head = nn.LazyLinear(num_classes)"
                ),
                why="A Linear's in_features must equal the last dimension of its input; after conv stacks it is "
                "channels x height x width of the flattened map.",
                verify="A dummy forward `model(torch.zeros(2, *input_shape))` runs and returns (2, num_classes).",
                location=case.location,
            ),
            Fix(
                title="Flatten only the feature dimensions",
                snippet="h = torch.flatten(h, start_dim=1)   # keeps the batch dimension\n# not h.view(-1) or h.view(-1, 512)",
                why="view(-1, n) silently folds the batch into the features when n is wrong.",
                verify="h.shape[0] equals the batch size after flattening.",
            ),
            Fix(
                title="Assert shapes at module boundaries",
                snippet="b, c, hgt, wdt = x.shape\nassert c == self.in_channels, f'expected {self.in_channels} channels, got {c}'",
                why="A named assertion fails at the boundary with both numbers, not three layers later.",
                verify="Wrong inputs fail with the assertion's message.",
            ),
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
            Fix(
                title="Pad each batch to its longest sample in a collate_fn",
                snippet=(
                    "from torch.nn.utils.rnn import pad_sequence\n\n"
                    "def pad_collate(batch):                      # module level, so workers can pickle it\n"
                    "    xs, ys = zip(*batch)\n"
                    "    lengths = torch.tensor([len(x) for x in xs])\n"
                    "    xs = pad_sequence(xs, batch_first=True, padding_value=0)\n"
                    "    return xs, lengths, torch.stack(ys)\n\n"
                    "loader = DataLoader(dataset, batch_size=32, collate_fn=pad_collate)"
                ),
                why="Padding to the longest sample of each batch keeps every sample; pass the lengths (or a mask) "
                "so the model and the loss ignore the padding.",
                verify="for batch in loader: runs over a whole epoch, and the padded positions are masked out.",
                location=case.location,
            ),
            Fix(
                title="Keep per-sample targets of varying size as a list",
                snippet=(
                    "def detection_collate(batch):\n"
                    "    images, targets = zip(*batch)\n"
                    "    return torch.stack(images), list(targets)   # boxes per image stay separate"
                ),
                why="Targets with a different count per sample (boxes, keypoints) should not be stacked at all.",
                verify="The loss receives one target tensor per image.",
                applies_when="The mismatched dimension is a count of objects, not a length or a size.",
            ),
            Fix(
                title="Or make the samples one size in the dataset",
                snippet="transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor()])",
                why="Images (or crops) of one fixed size stack with the default collate_fn.",
                verify="Every dataset[i][0].shape is the same.",
                applies_when="Resizing or cropping does not lose what the model needs.",
            ),
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
            Fix(
                title="Use the registering containers",
                snippet="self.layers = nn.ModuleList([Block(d) for _ in range(n)])\n"
                "self.heads = nn.ModuleDict({'cls': nn.Linear(d, 10), 'box': nn.Linear(d, 4)})\n"
                "self.scales = nn.ParameterList([nn.Parameter(torch.ones(d)) for _ in range(n)])",
                why="ModuleList/ModuleDict/ParameterList register their contents as children of the module.",
                verify="sum(p.numel() for p in model.parameters()) includes them; they appear in model.state_dict().",
                location=case.location,
            )
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
            Fix(
                title="Unfreeze them and build the optimizer over what trains",
                snippet="for p in model.encoder.parameters():\n    p.requires_grad_(True)\n"
                "optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)",
                why="Parameters unfrozen after the optimizer was created are not in its param groups and never update.",
                verify="Every parameter that should train appears in optimizer.param_groups and has a .grad after backward.",
                location=case.location,
            ),
            Fix(
                title="Check for a cut in the forward",
                snippet="loss.backward()\nprint([n for n, p in model.named_parameters() if p.requires_grad and p.grad is None])",
                why="Parameters whose outputs pass through .detach() or .item() before the loss get no gradient.",
                verify="The printed list is empty.",
            ),
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
            Fix(
                title="Freeze the backbone and optimise only what trains",
                snippet=(
                    "for p in model.backbone.parameters():\n"
                    "    p.requires_grad_(False)\n"
                    "optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=lr)"
                ),
                why="Frozen parameters get no .grad and no optimizer state (less memory); an optimizer built over "
                "model.parameters() would still apply weight decay to them.",
                verify="sum(p.numel() for p in model.parameters() if p.requires_grad) counts only the head.",
                location=case.location,
            ),
            Fix(
                title="Keep frozen BatchNorm layers in eval mode",
                snippet=(
                    "class Finetuned(nn.Module):\n"
                    "    def train(self, mode: bool = True):\n"
                    "        super().train(mode)\n"
                    "        self.backbone.eval()   # running mean/var stay as pretrained\n"
                    "        return self"
                ),
                why="model.train() puts every BatchNorm back in training mode, where it keeps updating its running "
                "statistics even with requires_grad=False.",
                verify="backbone BatchNorm running_mean is unchanged after an epoch.",
            ),
            Fix(
                title="Unfreeze later with its own learning rate",
                snippet=(
                    "for p in model.backbone.parameters():\n"
                    "    p.requires_grad_(True)\n"
                    "optimizer.add_param_group({'params': list(model.backbone.parameters()), 'lr': lr / 10})"
                ),
                why="Parameters unfrozen after the optimizer was built are not in its param groups until added.",
                verify="len(optimizer.param_groups) grows by one and the backbone's weights change after a step.",
                applies_when="Gradual unfreezing after the head has trained for a while.",
            ),
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
            Fix(
                title="Call the module, not its forward",
                snippet="out = model(x)          # not model.forward(x)",
                why="__call__ runs the hooks around forward; forward alone is only the computation.",
                verify="Registered hooks fire (e.g. a forward hook's print appears).",
                location=case.location,
            )
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
            Fix(
                title="Call super().__init__() first in __init__",
                snippet="class Net(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n        self.fc = nn.Linear(d, d)",
                why="Module.__init__ creates the dictionaries that hold parameters, buffers, submodules and hooks.",
                verify="Constructing the module works and list(model.parameters()) is not empty.",
                location=case.location,
            )
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
            Fix(
                title="Register it as a buffer",
                snippet="self.register_buffer('mask', torch.tril(torch.ones(t, t)))                 # saved with the model\n"
                "self.register_buffer('cache', torch.zeros(d), persistent=False)  # moved, but not saved",
                why="Buffers move with .to()/.cuda()/.half() and (if persistent) are part of state_dict, without being trained.",
                verify="After model.cuda(), the tensor is on the GPU; it appears in model.state_dict() when persistent.",
                location=case.location,
            )
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
            Fix(
                title="Return logits from forward; apply softmax only for predictions",
                snippet="def forward(self, x):\n    return self.head(self.body(x))      # logits\n\n"
                "loss = F.cross_entropy(model(x), y)\nprobs = model(x).softmax(dim=-1)   # inference only",
                why="Keeping the loss on logits is both correct and numerically stable.",
                verify="The loss at initialisation is about ln(num_classes) and training accuracy rises.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds softmax outputs passed to CrossEntropyLoss."],
    )


def _sdpa_fix(case: Case) -> Fix:
    return Fix(
        title="Replace the hand-written attention with F.scaled_dot_product_attention",
        snippet=(
            "q, k, v = (t.view(b, s, heads, d // heads).transpose(1, 2) for t in (q, k, v))  # (b, heads, s, hd)\n"
            "out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)\n"
            "out = out.transpose(1, 2).reshape(b, s, d)"
        ),
        why="One call computes softmax(q kᵀ / sqrt(d)) v with Flash or memory-efficient kernels when available; "
        "it never materialises the (s x s) score matrix and applies the 1/sqrt(d) scale for you.",
        verify="Outputs match the manual version (torch.testing.assert_close in float32); attention memory drops for long sequences.",
        location=case.location,
        applies_when="Pass dropout only in training (dropout_p=0.0 in eval): SDPA does not look at self.training.",
    )


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
            Fix(
                title="A module skeleton with the usual pieces in place",
                snippet=_SKELETON,
                why="Registration makes parameters visible to optimizers, .to(), state_dict and DDP; the loss outside "
                "keeps the model reusable for inference.",
                verify="A dummy forward returns the documented shape; the parameter count matches your estimate.",
            ),
            Fix(
                title="Test each module with a tiny batch before training",
                snippet="def test_classifier_shapes():\n    m = Classifier(num_classes=10)\n"
                "    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)",
                why="Shape and registration bugs show up in milliseconds instead of after data loading.",
                verify="The test passes in well under a second.",
            ),
        ],
        [f"`{case.check_cmd('TD2')}` checks module structure: registration, super().__init__, buffers, loss inputs."],
    )


def _vectorise_fix(case: Case) -> Fix:
    return Fix(
        title="Vectorise the layer: no Python loops over batch items, heads or positions",
        snippet=(
            "# slow: out = torch.stack([self.proj(x[i]) for i in range(x.shape[0])])\n"
            "out = self.proj(x)                                        # one batched call\n"
            "scores = torch.einsum('bhqd,bhkd->bhqk', q, k)          # batched contractions"
        ),
        why="Each Python iteration dispatches its own small kernels; batched ops do the same work in one launch.",
        verify="The layer's time in the profiler falls roughly by the loop length.",
        location=case.location,
    )


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
            Fix(
                title="Use the built-in fused ops",
                snippet="y = F.layer_norm(x, (d,), self.weight, self.bias)\n"
                "y = F.gelu(x)\nout = F.scaled_dot_product_attention(q, k, v)",
                why="Built-in ops run one optimised kernel where a hand-written formula runs several.",
                verify="Outputs match (torch.testing.assert_close); the layer gets faster.",
            ),
            Fix(
                title="Keep forward free of host syncs and new CPU tensors",
                snippet="idx = torch.arange(s, device=x.device)   # not torch.arange(s).to(x.device) each call\n"
                "# avoid x.item(), x.tolist(), print(x) and `if x.any():` in forward",
                why="Each sync stalls the GPU queue; each CPU tensor costs a host-to-device copy per call.",
                verify="The profiler shows no aten::item / cudaMemcpy inside the layer.",
            ),
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
            Fix(
                title="Register constant tensors as buffers so .to(device) moves them",
                snippet="self.register_buffer('pos', torch.arange(max_len))   # instead of self.pos = torch.arange(max_len)",
                why="model.to(device) moves parameters and buffers, not plain tensor attributes.",
                verify="set(b.device for b in model.buffers()) holds a single device after model.to(device).",
                location=case.location,
            ),
            Fix(
                title="Create tensors in forward on the input's device",
                snippet="mask = torch.ones(b, s, device=x.device, dtype=torch.bool)",
                why="Factory functions allocate on the CPU unless told otherwise.",
                verify="The forward runs on GPU without a device error.",
            ),
            Fix(
                title="Move every batch where the model is",
                snippet="device = next(model.parameters()).device\nx, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
                why="The DataLoader yields CPU tensors.",
                verify="x.device == device for every batch.",
            ),
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
            Fix(
                title="Remove or route around dead parameters",
                snippet="# every parameter should be reachable from the loss on every step:\n"
                "out = self.main(x) + 0.0 * sum(p.sum() for p in self.aux.parameters())  # keep aux in the graph\n"
                "# better: delete self.aux if it is never used, or freeze it for this phase",
                why="A parameter outside the graph gets no gradient; DDP must then be told or it errors.",
                verify="After backward, every trainable parameter has a .grad.",
                location=case.location,
                applies_when="The zero-weighted sum is a stopgap for conditionally used branches; prefer removing or freezing.",
            )
        ],
        [f"`{case.run_cmd(extra='--steps 5')}` lists parameters without gradients after backward."],
    )


@SPECIALIST.handles("dtype-mismatch")
def dtype(case: Case) -> Advice:
    return Advice(
        "From the model's side: keep parameters and buffers in one dtype (cast the module with .to(dtype), which "
        "also converts registered buffers) and convert inputs at the model's boundary.",
        [
            Fix(
                title="Cast inputs to the model's dtype at the boundary",
                snippet="param = next(model.parameters())\nx = x.to(device=param.device, dtype=param.dtype)",
                why="Plain tensor attributes and inputs from numpy (float64) are not converted by model.to(dtype).",
                verify="x.dtype matches the parameters' dtype before forward.",
                location=case.location,
            )
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
            Fix(
                title="Use an nn.Dropout module (or pass training=self.training)",
                snippet="self.drop = nn.Dropout(p=0.1)        # in __init__; follows model.train()/eval()\n"
                "x = self.drop(x)                      # in forward\n"
                "# or: x = F.dropout(x, p=0.1, training=self.training)",
                why="nn.Dropout reads the module's training flag; F.dropout only knows what it is passed.",
                verify="In eval mode two forward passes on the same input give identical outputs.",
                location=case.location,
            )
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
            Fix(
                title="Size output and embedding layers from the data",
                snippet="num_classes = int(labels.max()) + 1            # labels must be 0..num_classes-1\n"
                "self.head = nn.Linear(d, num_classes)\n"
                "self.embed = nn.Embedding(len(vocab), d, padding_idx=vocab.pad_id)",
                why="Class indices must lie in [0, num_classes); token ids in [0, num_embeddings).",
                verify="labels.max() < num_classes and tokens.max() < embed.num_embeddings for every batch.",
                location=case.location,
            ),
            Fix(
                title="Mark padding / unlabeled targets with ignore_index",
                snippet="loss = F.cross_entropy(logits, target, ignore_index=-100)   # -100 is the default",
                why="Padding labels such as -1 are out of range unless the loss is told to skip them.",
                verify="No out-of-bounds error; padded positions do not contribute to the loss.",
                applies_when="Some targets mean 'no label'.",
            ),
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
            Fix(
                title="Check registration and shapes with a dummy batch",
                snippet="print(sum(p.numel() for p in model.parameters()))\nprint(model(torch.zeros(2, *input_shape)).shape)",
                why="Unregistered pieces are invisible to the optimizer; a dummy forward exercises every shape.",
                verify="The parameter count matches your estimate; the output shape is the documented one.",
            )
        ],
        [f"`{case.check_cmd('TD2')}` checks the module code."],
    )

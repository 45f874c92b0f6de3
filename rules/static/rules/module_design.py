"""TD2xx — module design: registration of submodules, parameters and buffers, forward() misuse,
softmax before a loss that expects logits, hand-written attention. Docs: module_design.toml."""

from __future__ import annotations

import ast
import re
from operator import attrgetter

from torchdoctor.rules.static.api import Context, project, rule
from torchdoctor.rules.static.index import ClassInfo, Index, dotted, is_constant, kwarg, last_name, vocabulary
from torchdoctor.rules.static.patterns import (
    LOG_PROBABILITIES,
    attention_probs,
    latest_value,
    probabilities_origin,
    requires_grad_in_chain,
    tensor_factory,
    unpacked_from,
)
from torchdoctor.rules.static.project import Project, ProjectHit
from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import stmt_position


def _module_class(ctx: Context, node: ast.ClassDef) -> ClassInfo | None:
    info = ctx.index.classes.get(node.name)
    return info if info is not None and info.node is node and info.is_module else None


# torch.nn layers with no parameters, no buffers and no train/eval behaviour: kept in a plain dict or list,
# nothing is lost (no parameter the optimizer misses, no state to move or save, no mode to switch).
_STATELESS_LAYERS = frozenset(
    "Flatten Unflatten Identity ReLU ReLU6 LeakyReLU GELU SiLU Mish Tanh Sigmoid Softplus Softsign Hardtanh "
    "Hardswish Hardsigmoid ELU SELU CELU Softmax LogSoftmax Softmin Upsample UpsamplingNearest2d "
    "UpsamplingBilinear2d MaxPool1d MaxPool2d MaxPool3d AvgPool1d AvgPool2d AvgPool3d AdaptiveAvgPool1d "
    "AdaptiveAvgPool2d AdaptiveAvgPool3d AdaptiveMaxPool1d AdaptiveMaxPool2d AdaptiveMaxPool3d PixelShuffle "
    "PixelUnshuffle ZeroPad2d ConstantPad1d ConstantPad2d ReflectionPad2d ReplicationPad2d".split()
)


def _constructs_module(index: Index, expr: ast.AST | None) -> str | None:
    """The class name when `expr` builds a module or a parameter (`nn.Linear(...)`, `Block(...)`); not a
    stateless torch layer (`nn.Flatten()`, `nn.ReLU()`), which a plain container holds without loss."""
    if not isinstance(expr, ast.Call):
        return None
    q = index.resolve(expr.func)
    if q is not None:
        short = q.rsplit(".", 1)[-1]
        if q.startswith("torch.nn.") and q.count(".") == 2 and short[:1].isupper():
            return None if short in _STATELESS_LAYERS else short
        if q == "copy.deepcopy" and expr.args:
            return _constructs_module(index, expr.args[0])
        return None
    local = dotted(expr.func)
    info = index.classes.get(local or "")
    return local if info is not None and info.is_module else None


def _plain_container(index: Index, expr: ast.AST) -> tuple[str, str] | None:
    """("list" | "dict", held class) when `expr` is a plain Python container of modules or parameters."""
    if isinstance(expr, ast.List | ast.Tuple | ast.Set):
        for elt in expr.elts:
            held = _constructs_module(index, elt)
            if held:
                return "list", held
    elif isinstance(expr, ast.ListComp | ast.GeneratorExp | ast.SetComp):
        held = _constructs_module(index, expr.elt)
        if held:
            return "list", held
    elif isinstance(expr, ast.Dict):
        for value in expr.values:
            held = _constructs_module(index, value)
            if held:
                return "dict", held
    elif isinstance(expr, ast.DictComp):
        held = _constructs_module(index, expr.value)
        if held:
            return "dict", held
    elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return _plain_container(index, expr.left) or _plain_container(index, expr.right)
    elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("list", "tuple", "dict"):
        if expr.args:
            found = _plain_container(index, expr.args[0])
            if found:
                return ("dict" if expr.func.id == "dict" else "list"), found[1]
    return None


def _is_empty_container(expr: ast.AST) -> str | None:
    if isinstance(expr, ast.List) and not expr.elts:
        return "list"
    if isinstance(expr, ast.Dict) and not expr.keys:
        return "dict"
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("list", "dict") and not expr.args:
        return expr.func.id
    return None


def _registered_attrs(index: Index, info: ClassInfo) -> set[str]:
    """Attributes that some assignment makes a registered container, module, parameter or buffer."""
    registered: set[str] = set()
    containers = index.names["module_containers"]
    for a in index.self_assignments(info, None):
        if isinstance(a.value, ast.Call):
            q = index.resolve(a.value.func) or ""
            if q in containers or q in ("torch.nn.Parameter", "torch.nn.Buffer"):
                registered.add(a.attr)
    for call in index.method_calls("register_buffer") + index.method_calls("register_parameter") + index.method_calls(
        "register_module"
    ) + index.method_calls("add_module"):
        if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
            if index.class_of(call) is info:
                registered.add(call.args[0].value)
    registered |= _handed_to_a_registrar(index, info)
    registered |= _wrapped_in_a_container(index, info)
    return registered


def _wrapped_in_a_container(index: Index, info: ClassInfo) -> set[str]:
    """`self.paths = [...]` then `self.path_module_list = nn.ModuleList(self.paths)` (pytorch-semseg's
    pyramidPooling): the same modules are registered through the container, so the plain list is only a view."""
    containers = index.names["module_containers"]
    out: set[str] = set()
    for a in index.self_assignments(info, None):
        value = a.value
        if isinstance(value, ast.Call) and (index.resolve(value.func) or "") in containers:
            for arg in value.args:
                inner = arg.value if isinstance(arg, ast.Starred) else arg
                name = dotted(inner) or ""
                if name.startswith("self.") and name.count(".") == 1:
                    out.add(name[5:])
    return out


_REGISTRAR = re.compile(r"regist|(?:^|_)add_?to|add_param|add_module", re.IGNORECASE)


def _handed_to_a_registrar(index: Index, info: ClassInfo) -> set[str]:
    """`self._add_to_parameters(self.kernels, 'TDNN_kernel')`, or `for i, m in enumerate(self.gate):
    self._add_to_parameters(m.parameters(), ...)`: a registration helper of the project (kefirski/pytorch_RVAE
    patches one onto nn.Module) registers the list's parameters one by one."""
    out: set[str] = set()
    # the method names a registrar may have, from the calls index's table of method calls (asked per class: the
    # loop over every call of the file was made once per class)
    methods = frozenset(m for m in index.calls_by_method if _REGISTRAR.search(m))
    for call in index.calls_named(frozenset(), methods) if methods else ():
        func = call.func  # type: ignore[attr-defined]
        if not (isinstance(func, ast.Attribute) and dotted(func.value) == "self" and _REGISTRAR.search(func.attr)):
            continue
        if index.class_of(call) is not info:
            continue
        for arg in call.args:  # type: ignore[attr-defined]
            name = dotted(arg) or ""
            if name.startswith("self."):
                out.add(name[5:])
                continue
            base = arg.func.value if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) \
                and arg.func.attr == "parameters" else arg
            if not isinstance(base, ast.Name):
                continue
            for anc in index.ancestors(call):
                if isinstance(anc, ast.For) and base.id in {n.id for n in subtree(anc.target) if isinstance(n, ast.Name)}:
                    it = anc.iter.args[0] if isinstance(anc.iter, ast.Call) and dotted(anc.iter.func) == "enumerate" \
                        and anc.iter.args else anc.iter
                    if (dotted(it) or "").startswith("self."):
                        out.add((dotted(it) or "")[5:])
                    break
    return out


_REPLACEMENT = {
    ("list", False): "nn.ModuleList",
    ("dict", False): "nn.ModuleDict",
    ("list", True): "nn.ParameterList",
    ("dict", True): "nn.ParameterDict",
}


@rule("TD201", ast.ClassDef)
def modules_in_plain_container(node: ast.ClassDef, ctx: Context) -> None:
    info = _module_class(ctx, node)
    if info is None:
        return
    index = ctx.index
    registered = _registered_attrs(index, info)
    reported: set[str] = set()
    empty: dict[str, str] = {}
    for a in index.self_assignments(info, None):
        if a.attr in registered or a.attr in reported:
            continue
        found = _plain_container(index, a.value)
        if found is not None:
            kind, held = found
            reported.add(a.attr)
            ctx.report(
                a.stmt,
                variable=f"self.{a.attr}",
                container=kind,
                held=held,
                replacement=_REPLACEMENT[(kind, held == "Parameter")],
            )
        elif (kind := _is_empty_container(a.value)) is not None:
            empty[a.attr] = kind
    if not empty:
        return
    # self.blocks = []; self.blocks.append(nn.Linear(...))   /   self.heads = {}; self.heads[k] = nn.Linear(...)
    candidates: list[tuple[ast.AST, str, ast.AST | None]] = []
    for method in ("append", "insert"):
        for call in index.method_calls(method):
            receiver = call.func.value  # type: ignore[attr-defined]
            value = call.args[-1] if call.args else None
            candidates.append((call, dotted(receiver) or "", value))
    for stmt in index.nodes(ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Subscript):
                candidates.append((stmt, dotted(target.value) or "", stmt.value))
    for where, receiver, value in sorted(candidates, key=lambda c: (c[0].lineno, c[0].col_offset)):
        if not receiver.startswith("self."):
            continue
        attr = receiver[5:]
        if attr not in empty or attr in registered or attr in reported:
            continue
        held = _constructs_module(index, value)
        if held and index.class_of(where) is info:
            reported.add(attr)
            kind = empty[attr]
            ctx.report(
                where,
                variable=f"self.{attr}",
                container=kind,
                held=held,
                replacement=_REPLACEMENT[(kind, held == "Parameter")],
            )


@rule("TD202", ast.Call, methods=("forward",))
def forward_called_directly(node: ast.Call, ctx: Context) -> None:
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr != "forward":
        return
    receiver = func.value
    if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
        return
    if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls", "super"):
        return
    index = ctx.index
    name = dotted(receiver)
    if name is None:
        return
    root = name.split(".", 1)[0]
    if root in index.classes or (index.resolve(receiver) or "").rsplit(".", 1)[-1][:1].isupper():
        return  # Base.forward(self, x): an explicit base-class call
    if root == "self":
        info = index.class_of(node)
        if info is None or not info.is_module:
            return
        fn = index.function_of(node)
        if fn is not None and fn.name == "forward":
            return  # a wrapper's forward delegating on purpose
        attr = name.split(".")[1]
        if not any(
            a.attr == attr and _constructs_module(index, a.value) for a in index.self_assignments(info, None)
        ):
            return
    else:
        b = index.binding(receiver)
        if b is not None:
            if b.kind != "module":
                return
        elif not index.is_model(receiver):
            return
        if _optional_parameter(index, receiver, node):
            # `def degradation_bsrgan(img, ..., isp_model=None)`: an optional argument that only its name calls a
            # model (BSRGAN's camera-pipeline hook, which no caller passes): whether it is an nn.Module, and has
            # hooks to skip, is the caller's business. Reported at info.
            ctx.report(node, severity="info", variable=name)
            return
    ctx.report(node, variable=name)


def _optional_parameter(index: Index, receiver: ast.AST, at: ast.AST) -> bool:
    """`receiver` is a parameter of the enclosing function whose default is None."""
    fn = index.function_of(at)
    if not isinstance(receiver, ast.Name) or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    args = fn.args.posonlyargs + fn.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(fn.args.defaults):]], fn.args.defaults, strict=True))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d})
    return receiver.id in defaults and is_constant(defaults[receiver.id], None) and not index.definitions(receiver.id, at)


@rule("TD203", ast.ClassDef)
def missing_super_init(node: ast.ClassDef, ctx: Context) -> None:
    info = _module_class(ctx, node)
    if info is None:
        return
    init = info.method("__init__")
    if init is None:
        return
    for sub in subtree(init):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "__init__":
            return  # super().__init__(...), super(Net, self).__init__(), nn.Module.__init__(self)
    ctx.report(init, variable=node.name)


def _tensor_value(index: Index, value: ast.AST, at: ast.AST) -> ast.AST | None:
    """The expression a tensor attribute is assigned from, following one local name (`self.m = mask`)."""
    if isinstance(value, ast.Name):
        found = latest_value(index, value.id, at)
        return found
    return value


@rule("TD204", ast.ClassDef)
def tensor_attribute_not_buffer(node: ast.ClassDef, ctx: Context) -> None:
    info = _module_class(ctx, node)
    if info is None or any(m in info.methods for m in ("_apply", "to", "cuda")):
        return  # the class moves its tensors itself
    index = ctx.index
    registered = _registered_attrs(index, info)
    reads: dict[str, list[ast.Attribute]] | None = None
    reported: set[str] = set()
    for a in index.self_assignments(info, "__init__"):
        if a.attr in registered or a.attr in reported:
            continue
        value = _tensor_value(index, a.value, a.stmt)
        if tensor_factory(index, value) is None or requires_grad_in_chain(value):
            continue
        if _scalar_constant(index, value, a.stmt) and not _made_trainable(index, info, a.attr):
            continue  # a 0-dim constant: a CPU scalar mixes with tensors on any device, and holds no state
        if reads is None:
            reads = index.self_reads(info)
        if a.attr not in reads or all(_moved_or_replaced(index, r) for r in reads[a.attr]):
            continue  # never read, or every read moves it to the input's device first / replaces it
        if _moves_itself(index, info, a.attr):
            continue  # `self.mask = self.mask.to(x)` in forward: the class keeps it on the input's device
        reported.add(a.attr)
        ctx.report(a.stmt, variable=f"self.{a.attr}", name=a.attr, value=ctx.segment(a.value, 50))


_SCALAR_FACTORIES = frozenset({"torch.tensor", "torch.as_tensor", "torch.scalar_tensor"})


def _number(node: ast.AST | None) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (int, float, bool)


def _scalar_constant(index: Index, value: ast.AST | None, at: ast.AST) -> bool:
    """`torch.tensor(1.0)`, `torch.tensor(clip_threshold, dtype=torch.float)` with `clip_threshold = 1.0` at
    module level: a 0-dim tensor of a number written in the file (minimalRL's vtrace.py)."""
    if not isinstance(value, ast.Call) or index.resolve(value.func) not in _SCALAR_FACTORIES or not value.args:
        return False
    arg = value.args[0]
    if _number(arg):
        return True
    if not isinstance(arg, ast.Name):
        return False
    found = index.definitions(arg.id, at) or [v for _s, v in index.defs(index.tree).get(arg.id, [])]
    return bool(found) and all(_number(v) for v in found)


def _made_trainable(index: Index, info: ClassInfo, attr: str) -> bool:
    """`self.log_alpha.requires_grad = True` or `.requires_grad_()` anywhere in the file: learned, not constant."""
    for node in index.nodes(ast.Assign):
        for t in node.targets:  # type: ignore[attr-defined]
            if isinstance(t, ast.Attribute) and t.attr == "requires_grad" and dotted(t.value) in (f"self.{attr}", attr):
                return True
    return any(dotted(c.func.value) == f"self.{attr}" for c in index.method_calls("requires_grad_")  # type: ignore[attr-defined]
               if isinstance(c.func, ast.Attribute))


def _moves_itself(index, info, attr: str) -> bool:
    """Outside `__init__`, the class reassigns the tensor on a device or dtype it chooses: `self.m = self.m.to(x)`,
    `self.grid = self._make_grid(nx, ny).to(x.device)` (a placeholder rebuilt where the input is)."""
    for a in index.self_assignments(info, None):
        if a.attr != attr or a.method.name == "__init__":
            continue
        value = a.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr in ("to", "type_as", "cuda", "type") and value.args:
            return True
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr in ("to", "type_as", "cuda", "type") and dotted(value.func.value) == f"self.{attr}":
            return True
    return False


def _moved_or_replaced(index, read: ast.Attribute) -> bool:
    """`self.z.type_as(w)`, `self.grid.to(x.device)`, `self.grid = make_grid(...).to(x.device)`, `self.grid.shape`:
    this read puts the tensor on the right device itself, overwrites it, or reads only its metadata, so the
    module's `.to()` need not move it."""
    parent = index.parent(read)
    if isinstance(parent, ast.Attribute) and parent.attr in ("shape", "ndim", "dtype", "device"):
        return True  # metadata: the same on any device
    if isinstance(parent, ast.Attribute) and parent.attr == "type":
        grand = index.parent(parent)
        if isinstance(grand, ast.Call) and grand.func is parent and not grand.args and not grand.keywords:
            return True  # `self.mask.type() != x.type()`: its type name, before moving it
    if isinstance(parent, ast.Attribute) and parent.attr in ("to", "type_as", "cuda", "new_tensor", "size", "dim"):
        return isinstance(index.parent(parent), ast.Call)
    if isinstance(parent, ast.Assign) and read in parent.targets:
        return True
    if isinstance(read.ctx, ast.Store):
        return True
    return _moved_through_local(index, read) or _read_on_the_host(index, read)


def _read_on_the_host(index, read: ast.Attribute) -> bool:
    """A read that Python itself consumes (tabnet's `self.continuous_idx` column mask): the iterable of a `for`
    (through enumerate/zip/list), an element compared in an `if`/`while` test, or an element written in
    `__init__`. Such a tensor never meets the device tensors, so leaving it on the CPU is right."""
    parent = index.parent(read)
    if isinstance(parent, ast.Subscript) and parent.value is read:
        if isinstance(parent.ctx, ast.Store):
            fn = index.function_of(read)
            return fn is not None and fn.name == "__init__"
        node, up = parent, index.parent(parent)
        if not isinstance(up, ast.Compare):
            return False
        while up is not None and not isinstance(up, ast.stmt):
            node, up = up, index.parent(up)
        return isinstance(up, ast.If | ast.While) and node is up.test
    node = read
    while isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) \
            and parent.func.id in ("enumerate", "zip", "list", "reversed") and node in parent.args:
        node, parent = parent, index.parent(parent)
    return isinstance(parent, ast.For | ast.comprehension) and parent.iter is node


_MOVES = ("to", "type_as", "cuda")


def _moved_through_local(index, read: ast.Attribute) -> bool:
    """`t = self.integration_time if t is None else t` then `t = t.to(x.device)` (a neural-ODE block): the
    local the attribute goes into is moved before anything else reads it."""
    node: ast.AST = read
    parent = index.parent(node)
    while isinstance(parent, ast.IfExp) and node is not parent.test:
        node, parent = parent, index.parent(parent)
    if not (isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1
            and isinstance(parent.targets[0], ast.Name)):
        return False
    name, fn = parent.targets[0].id, index.function_of(read)
    if fn is None:
        return False
    after = sorted((n for n in subtree(fn) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                    and (n.lineno, n.col_offset) >= (parent.end_lineno, parent.end_col_offset)),
                   key=lambda n: (n.lineno, n.col_offset))
    if not after:
        return False
    first = index.parent(after[0])
    return isinstance(first, ast.Attribute) and first.attr in _MOVES and isinstance(index.parent(first), ast.Call)


_LOSS_CLASSES = {"torch.nn.CrossEntropyLoss": "cross_entropy", "torch.nn.NLLLoss": "nll"}


_FUNCTIONAL_LOSSES = frozenset({"torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss"})


def _loss_kind(index, node: ast.Call, bound: bool = True) -> str | None:
    """`bound`: some name of the file holds a cross-entropy or NLL loss module (else no call can be one)."""
    q = index.callee(node)
    if q == "torch.nn.functional.cross_entropy":
        return "cross_entropy"
    if q == "torch.nn.functional.nll_loss":
        return "nll"
    if not bound:
        return None
    b = index.binding(node.func)
    if b is not None and b.kind == "loss":
        if len(node.args) > 2:
            # a loss module's forward takes (input, target): a call with more is another callable bound to the
            # same name on a path the binding does not cover (`self.loss_fn(lprobs, labels, eps)`)
            return None
        return _LOSS_CLASSES.get(b.cls or "")
    return None


# Tensor methods that hand on the same values in another shape or layout: a loss class that reshapes its input
# before the cross-entropy still computes the cross-entropy of that input.
_SAME_VALUES = frozenset({"view", "reshape", "permute", "transpose", "contiguous", "flatten", "squeeze", "unsqueeze",
                          "float", "double", "to", "cuda", "cpu"})


def _from_parameter(index: Index, expr: ast.AST | None, param: str, depth: int = 0) -> bool:
    """Whether `expr` is the parameter `param`, reshaped or sliced (`predict.transpose(1, 2).contiguous()`,
    `classes[:, 0, :]`), followed through the function's own assignments."""
    if expr is None or depth > 8:
        return False
    if isinstance(expr, ast.Subscript):
        return _from_parameter(index, expr.value, param, depth + 1)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _SAME_VALUES:
        return _from_parameter(index, expr.func.value, param, depth + 1)
    if isinstance(expr, ast.Name):
        value = latest_value(index, expr.id, expr)
        if value is None:
            return expr.id == param
        return _from_parameter(index, value, param, depth + 1)
    return False


def wrapped_loss_kind(index: Index, info: ClassInfo) -> str | None:
    """A loss class (`CrossEntropy2d`, `CapsuleLoss`) whose forward hands its first input to cross-entropy or NLL:
    calling it is calling that loss on what it is given."""
    forward = info.method("forward")
    if forward is None:
        return None
    params = [a.arg for a in forward.args.posonlyargs + forward.args.args][1:]  # type: ignore[attr-defined]
    if not params:
        return None
    for call in index.calls_in(forward):
        kind = _loss_kind(index, call)
        if kind is not None and _from_parameter(index, kwarg(call, "input", 0), params[0]):
            return kind
    return None


def _loss_kinds(ctx: Context) -> dict[ast.Call, str]:
    """The cross-entropy / NLL calls of the file and their kind, worked out once per file: the torch losses, and
    calls of this file's loss classes that pass their input on to one."""
    def build() -> dict[ast.Call, str]:
        index = ctx.index
        # a call's binding is the latest one of its name: only a name whose latest binding is such a loss counts
        bound = any(bs[-1].kind == "loss" and bs[-1].cls in _LOSS_CLASSES for bs in index.bindings.values() if bs)
        out: dict[ast.Call, str] = {}
        wrappers = _wrapped_loss_kinds(ctx)
        wrapping = any(k is not None for k in wrappers.values())  # else no call of a local class is a loss
        # with neither, only the functional losses can be one: their calls, from the calls index (filed under
        # `callee`, the name `_loss_kind` compares), in the walk's order, not every call of the file
        calls = index.nodes(ast.Call) if bound or wrapping else index.calls_named(_FUNCTIONAL_LOSSES, frozenset())
        for call in calls:
            kind = _loss_kind(index, call, bound)  # type: ignore[arg-type]
            if kind is None and wrapping:
                cls = _local_class_called(index, call)  # type: ignore[arg-type]
                if cls is not None:
                    kind = wrappers[cls.name]
            if kind is not None:
                out[call] = kind  # type: ignore[index]
        return out
    return ctx.memo("module-design:loss-kinds", build)


def _wrapped_loss_kinds(ctx: Context) -> dict[str, str | None]:
    """`wrapped_loss_kind` of every module class of the file, by name, worked out once per file: the facts and the
    loss calls both ask it, and a file with no such class lets the loss calls skip the class lookup."""
    return ctx.memo("module-design:wrapped-loss-kinds",
                    lambda: {info.name: wrapped_loss_kind(ctx.index, info) for info in ctx.index.module_classes})


def _local_class_called(index: Index, call: ast.Call) -> ClassInfo | None:
    """The module class of this file whose instance `call` calls (`criterion = CapsuleLoss(); criterion(x, y)`)."""
    if not index.module_classes or not isinstance(call.func, (ast.Name, ast.Attribute)):
        return None
    if isinstance(call.func, ast.Name) and (call.func.id in index.functions or call.func.id in index.classes):
        return None  # a function of the file, or building a class, not calling an instance
    b = index.binding(call.func)
    info = index.classes.get(b.cls or "") if b is not None and b.kind == "module" else None
    if info is None and isinstance(call.func, ast.Name):
        name = _constructed_class(index, call.func)
        info = index.classes.get(name or "")
    return info if info is not None and info.is_module else None


@rule("TD205", ast.Module)
def softmax_before_loss(node: ast.AST, ctx: Context) -> None:
    _leave_softmax_facts(ctx)
    for call, kind in _loss_kinds(ctx).items():
        _softmax_before_loss(call, kind, ctx)


@rule("TD210", ast.Module)
def log_softmax_before_cross_entropy(node: ast.AST, ctx: Context) -> None:
    _leave_softmax_facts(ctx)
    index = ctx.index
    for call, kind in _loss_kinds(ctx).items():
        if kind != "cross_entropy":
            continue  # log_softmax into NLLLoss is the right pairing
        inputs = kwarg(call, "input", 0)  # type: ignore[arg-type]
        origin = probabilities_origin(index, inputs, call, kinds=LOG_PROBABILITIES) if inputs is not None else None
        if origin is None:
            continue
        seen = ctx.memo("module-design:log-softmax-layers", set)
        if id(origin) in seen:
            continue  # a model's last layer feeding several losses: one cause, one finding
        seen.add(id(origin))
        ctx.report(origin, variable=ctx.segment(inputs, 40), loss=ctx.segment(call.func),
                   remedy=_log_softmax_remedy(ctx.segment(call.func), f"line {call.lineno}"))


def _log_softmax_remedy(loss: str, where: str) -> str:
    return (f"Drop the log_softmax and pass the logits to `{loss}` ({where}), or keep it and use "
            "`F.nll_loss` / `nn.NLLLoss`, which expects log-probabilities.")


def _softmax_before_loss(node: ast.Call, kind: str, ctx: Context) -> None:
    index = ctx.index
    inputs = kwarg(node, "input", 0)  # type: ignore[arg-type]
    origin = probabilities_origin(index, inputs, node) if inputs is not None else None
    if origin is None:
        return
    if kind == "cross_entropy":
        expects = "logits: it applies log_softmax itself, so the softmax is applied twice"
        remedy = f"Pass the raw logits to `{ctx.segment(node.func)}` and drop the softmax (keep softmax only for reporting probabilities)."
    else:
        expects = "log-probabilities (log_softmax output), not probabilities"
        remedy = "Use `F.log_softmax(logits, dim=1)` in place of the softmax, or pass the logits to `F.cross_entropy`."
    own = index.class_of(origin)
    if own is not None and own is index.class_of(node) and index.function_of(origin) is own.method("forward") \
            and index.function_of(node) is not index.function_of(origin):
        # `y_hat = self(x)` in a LightningModule's training_step: forward's softmax serves predictions, so the
        # fix is to feed the loss the logits, at the loss.
        ctx.report(node, variable=ctx.segment(inputs, 40), loss=ctx.segment(node.func), expects=expects,
                   remedy=remedy + f" `{ctx.segment(inputs, 40)}` comes from this module's forward, which ends in "
                                   f"the softmax at line {origin.lineno}.")
        return
    if own is not None and index.function_of(origin) is not index.function_of(node):
        # The softmax is a model's last layer: the fix goes there, and every loss call it feeds is one cause.
        seen = ctx.memo("module-design:softmax-layers", set)
        if id(origin) in seen:
            return
        seen.add(id(origin))
        ctx.report(origin, variable=ctx.segment(inputs, 40), loss=ctx.segment(node.func),
                   expects=expects, remedy=remedy + f" The loss is applied at line {node.lineno}.")
        return
    if kind == "cross_entropy" and _only_feeds_losses(index, origin, node):
        # `outputs = torch.softmax(scores, -1)` used for nothing but the loss: the softmax is the line to drop
        ctx.report(origin, variable=ctx.segment(inputs, 40), loss=ctx.segment(node.func), expects=expects,
                   remedy=remedy + f" The loss is applied at line {node.lineno}.")
        return
    ctx.report(node, variable=ctx.segment(inputs, 40), loss=ctx.segment(node.func), expects=expects, remedy=remedy)


def _only_feeds_losses(index, origin: ast.AST, loss_call: ast.Call) -> bool:
    """The softmax sits in its own statement (`probs = softmax(x)`) whose name is read only on the way to the loss
    (the loss call, or a loop over it that calls the loss), not for metrics or predictions."""
    stmt = index.parent(origin)
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name) \
            or getattr(stmt, "lineno", 0) == loss_call.lineno:
        return False
    name = stmt.targets[0].id
    fn = index.function_of(loss_call)
    if fn is None or index.function_of(origin) is not fn:
        return False
    reads = [n for n in subtree(fn) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    for read in reads:
        anc = index.parent(read)
        if isinstance(anc, ast.For) and read is anc.iter:
            continue  # `for out in outputs:` whose body computes the loss
        if not any(a is loss_call for a in index.ancestors(read)) and read not in subtree(loss_call):
            return False
    return bool(reads)


def _leave_softmax_facts(ctx: Context) -> None:
    """For the project pass: model classes that end in softmax, functions that feed a model parameter's output
    to a cross-entropy loss, and calls that hand a model of a known class to a function of another file."""
    if ctx.memo("module-design:softmax-facts-left", lambda: [False])[0]:
        return  # TD205 and TD210 share these facts: left once per file
    ctx.memo("module-design:softmax-facts-left", lambda: [False])[0] = True
    index = ctx.index
    for info in index.module_classes:
        forward = info.method("forward")
        returns = [n.value for n in subtree(forward) if isinstance(n, ast.Return) and n.value is not None] \
            if forward is not None else []
        sizes = {len(r.elts) for r in returns if isinstance(r, ast.Tuple)}
        # `return probs, classes`: each element of a tuple every return builds is a value of its own
        positions: list[int | None] = [None] + (list(range(sizes.pop())) if len(sizes) == 1 and all(
            isinstance(r, ast.Tuple) for r in returns) else [])
        for softmax in ("softmax", "log_softmax"):
            for position in positions:
                origins = [probabilities_origin(index, r, r, position=position, kinds=frozenset({softmax}))
                           for r in returns]
                if origins and all(o is not None for o in origins):
                    ctx.leave("softmax-class", {"class": info.name, "kind": softmax, "position": position,
                                                "line": origins[0].lineno,  # type: ignore[union-attr]
                                                "col": origins[0].col_offset + 1})  # type: ignore[union-attr]
        wrapped = _wrapped_loss_kinds(ctx)[info.name]
        if wrapped is not None:
            ctx.leave("loss-class", {"class": info.name, "kind": wrapped})
    _leave_softmax_factories(ctx)
    kinds = _loss_kinds(ctx)
    _leave_loss_inputs(ctx, kinds)
    _leave_criterion_parameters(ctx)
    fed: dict[tuple[ast.AST, int], dict] = {}  # (function, parameter position) -> the loss it feeds
    for call, kind in kinds.items():  # the loss calls, in the walk's order as `_loss_kinds` met them
        if kind == "cross_entropy":
            fn = index.function_of(call)
            inputs = kwarg(call, "input", 0)  # type: ignore[arg-type]
            if isinstance(inputs, ast.Name):  # `class_pred = classifier(x)`, then the loss of class_pred
                inputs = latest_value(index, inputs.id, inputs)
            if fn is not None and isinstance(inputs, ast.Call) and isinstance(inputs.func, ast.Name):
                params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
                if inputs.func.id in params and isinstance(index.parent(fn), ast.Module):
                    fed.setdefault((fn, params.index(inputs.func.id)),
                                   {"loss": ctx.segment(call.func, 40), "line": call.lineno})
    for (fn, position), loss in _fed_through_callers(index, fed).items():
        ctx.leave("loss-on-param", {"function": fn.name, "position": position, **loss})  # type: ignore[attr-defined]
    _leave_constructor_models(ctx, kinds)
    _leave_method_model_losses(ctx, kinds)
    for call in index.nodes(ast.Call):
        kind = kinds.get(call)  # type: ignore[call-overload]
        if kind == "cross_entropy":
            inputs = kwarg(call, "input", 0)  # type: ignore[arg-type]
            if isinstance(inputs, ast.Name):
                inputs = latest_value(index, inputs.id, inputs)
            if isinstance(inputs, ast.Call) and isinstance(inputs.func, ast.Attribute):
                # `logits = self.linear_layer(feats)` with `self.linear_layer = SSLEvaluator(...)`, or
                # `pl_module.evaluator(x)` assigned `SSLEvaluator(...)` in another hook: the class is another file's
                cls = attribute_class(index, inputs.func)
                if cls is not None:
                    ctx.leave("loss-on-class-output", {"cls": cls, "loss": ctx.segment(call.func, 40),
                                                       "line": call.lineno})
        # no name and no call handed over (the test of every call's arguments, run as a loop in C)
        handed = [*map(type, call.args), *map(type, map(_VALUE, call.keywords))]  # type: ignore[attr-defined]
        if ast.Name not in handed and ast.Call not in handed:
            continue
        local = isinstance(call.func, ast.Name) and call.func.id in index.functions  # type: ignore[attr-defined]
        q = call.func.id if local else index.resolve(call.func)  # type: ignore[attr-defined]
        if q is None:
            _leave_models_handed_to_methods(ctx, call)  # type: ignore[arg-type]
        if q is None or not local and "." not in q or q.split(".", 1)[0] in ("torch", "torchvision", "numpy", "np"):
            continue  # a function of this file, or of another module the project pass can look up
        args = [(i, None, a) for i, a in enumerate(call.args)]  # type: ignore[attr-defined]
        args += [(None, k.arg, k.value) for k in call.keywords if k.arg]  # type: ignore[attr-defined]
        for i, keyword, arg in args:
            # a name built from a class, or a model built in place (`Trainer(MLP().cuda())`)
            among = _constructed_models(ctx, arg) if isinstance(arg, ast.Name) else \
                tuple(_value_classes(index, arg)) if isinstance(arg, ast.Call) else ()
            for cls in among:  # a model chosen at run time: each candidate class, the others named in the message
                ctx.leave("passes-model", {"callee": q, "position": i, "keyword": keyword, "cls": cls,
                                           "local": cls in index.classes, "callee_local": local,
                                           "among": list(among)})


def _leave_constructor_models(ctx: Context, kinds: dict[ast.Call, str]) -> None:
    """For the project pass: a trainer class of this file whose constructor keeps a model it is handed
    (`def __init__(self, model, ...): self.model = model`) and whose methods feed `self.model(x)` to a
    cross-entropy loss. A call of the class in another file (`Trainer(MLP())`) hands that constructor parameter a
    model, as `train(model, ...)` hands a function's; left as `loss-on-param` of the class, by the position a
    caller sees (after `self`), and by the parameter's name for callers that pass it by keyword."""
    index = ctx.index
    same = index.names["same_object_methods"]
    for call, kind in kinds.items():
        if kind != "cross_entropy":
            continue
        inputs = kwarg(call, "input", 0)  # type: ignore[arg-type]
        if isinstance(inputs, ast.Name):
            inputs = latest_value(index, inputs.id, inputs)
        while isinstance(inputs, ast.Call) and isinstance(inputs.func, ast.Attribute) and inputs.func.attr in _SAME_VALUES:
            inputs = inputs.func.value
        if not (isinstance(inputs, ast.Call) and isinstance(inputs.func, ast.Attribute)
                and isinstance(inputs.func.value, ast.Name) and inputs.func.value.id == "self"):
            continue
        info = index.class_of(call)
        init = info.method("__init__") if info is not None and isinstance(index.parent(info.node), ast.Module) \
            else None
        if init is None:
            continue
        params = [a.arg for a in init.args.posonlyargs + init.args.args][1:]  # type: ignore[attr-defined]
        kept = [a.value for a in index.self_assignments(info, "__init__") if a.attr == inputs.func.attr]
        value = kept[-1] if len(kept) == 1 else None  # one assignment: the model is what the caller handed in
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in same:
            value = value.func.value
        if isinstance(value, ast.Name) and value.id in params:
            ctx.leave("loss-on-param", {"function": info.name, "position": params.index(value.id),  # type: ignore[union-attr]
                                        "param": value.id, "loss": ctx.segment(call.func, 40), "line": call.lineno})


def _handed_criteria(index: Index, info: ClassInfo) -> dict[str, str]:
    """`def __init__(self, loss_func=CrossEntropyLoss()): self.loss_func = loss_func`: the attributes that keep a
    criterion the constructor is handed, by the kind of its default, the loss the trainer computes unless a caller
    hands another (IBM's dstc-noesis SupervisedTrainer)."""
    init = info.method("__init__")
    if init is None or not init.args.defaults:
        return {}
    args = init.args.posonlyargs + init.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(init.args.defaults):]], init.args.defaults, strict=True))
    found: dict[str, str] = {}
    assigned = [a.attr for a in index.self_assignments(info, None)]
    for a in index.self_assignments(info, "__init__"):
        default = defaults.get(a.value.id) if isinstance(a.value, ast.Name) else None
        kind = _LOSS_CLASSES.get(index.resolve(default.func) or "") if isinstance(default, ast.Call) else None
        if kind is not None and assigned.count(a.attr) == 1:  # kept as handed, never replaced in another method
            found[a.attr] = kind
    return found


def _handed_criterion_kind(index: Index, call: ast.Call, handed: dict[str, str]) -> str | None:
    """The kind of `self.loss_func(...)`, or of `loss_func(...)` after `loss_func = self.loss_func`, for an
    attribute that keeps a handed-in criterion (`_handed_criteria`)."""
    func = call.func
    if isinstance(func, ast.Name):
        func = latest_value(index, func.id, func)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return handed.get(func.attr)
    return None


def _called_parameter(index: Index, expr: ast.AST | None, params: list[str]) -> str | None:
    """The parameter whose call made `expr`: `model(x)`, followed through names and reshapes (`outputs =
    model(...)`, `outputs = outputs.unsqueeze(0)`)."""
    for _ in range(6):
        if isinstance(expr, ast.Name):
            expr = latest_value(index, expr.id, expr)
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _SAME_VALUES:
            expr = expr.func.value
        else:
            break
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in params:
        return expr.func.id
    return None


def _leave_method_model_losses(ctx: Context, kinds: dict[ast.Call, str]) -> None:
    """For the project pass: a method of a trainer class of this file that feeds its model parameter's output to a
    cross-entropy loss (`def _train_batch(self, ..., model, ...): loss = loss_func(model(x), y)`), and every method
    of the class that hands its own parameter on to it through `self.` (`train(model)` -> `_train_epoches(model)`
    -> `_train_batch(model)`). Left as `loss-on-method-param`, by position after `self` and by name; a call of
    `trainer.train(model)` in another file joins it."""
    index = ctx.index
    fed: dict[tuple[ast.AST, int], dict] = {}
    owners: dict[ast.AST, ClassInfo] = {}
    for info in index.classes.values():
        if not isinstance(index.parent(info.node), ast.Module) or info.is_module:
            continue  # a module's own methods run it (`self(x)`): the file's own pass follows those
        for fn in info.methods.values():
            owners[fn] = info
    if not owners:
        return
    handed = {info.name: _handed_criteria(index, info) for info in owners.values()}
    if not kinds and not any(handed.values()):
        return  # no cross-entropy here, called or kept: no method feeds one
    for fn, info in owners.items():
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]
        if not params:
            continue
        for call in index.calls_in(fn):
            kind = kinds.get(call) or (_handed_criterion_kind(index, call, handed[info.name])
                                       if handed[info.name] else None)
            if kind != "cross_entropy":
                continue
            name = _called_parameter(index, kwarg(call, "input", 0), params)
            if name is not None:
                fed.setdefault((fn, params.index(name)), {"loss": ctx.segment(call.func, 40), "line": call.lineno})
    if not fed:
        return
    for _ in range(3):  # handed on through `self.method(...)` calls of the same class
        added = False
        for fn, info in owners.items():
            params = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]
            for call in index.calls_in(fn):
                target = index.local_target(call)
                if target is None or target is fn or owners.get(target) is not info:
                    continue
                names = [a.arg for a in target.args.posonlyargs + target.args.args][1:]
                handed = [(i, a) for i, a in enumerate(call.args) if not isinstance(a, ast.Starred)]
                handed += [(names.index(k.arg), k.value) for k in call.keywords if k.arg in names]
                for position, arg in handed:
                    loss = fed.get((target, position))
                    if loss is not None and isinstance(arg, ast.Name) and arg.id in params \
                            and (fn, params.index(arg.id)) not in fed:
                        fed[(fn, params.index(arg.id))] = loss
                        added = True
        if not added:
            break
    for (fn, position), loss in fed.items():
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args][1:]  # type: ignore[attr-defined]
        ctx.leave("loss-on-method-param", {"class": owners[fn].name, "method": fn.name,  # type: ignore[attr-defined]
                                           "position": position, "param": params[position], **loss})


def _leave_models_handed_to_methods(ctx: Context, call: ast.Call) -> None:
    """`t = SupervisedTrainer(...)` then `t.train(dual_encoder, ...)`: a model of a known class handed to a method
    of an instance of another file's class (joined with `loss-on-method-param`)."""
    index = ctx.index
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)) or func.value.id == "self" \
            or func.value.id not in index.assigned_names() or index.binding(func.value) is not None:
        return  # a name of a known kind (a model, an optimizer, a loader) is no trainer
    if not _may_build_class(ctx, func.value.id):
        return  # no assignment of the receiver builds a class: `_constructed_class` would find none
    owner = _constructed_class(index, func.value)
    if owner is None or owner in index.classes:
        return
    args = [(i, None, a) for i, a in enumerate(call.args)]
    args += [(None, k.arg, k.value) for k in call.keywords if k.arg]
    for i, keyword, arg in args:
        among = _constructed_classes(index, arg) if isinstance(arg, ast.Name) else \
            tuple(_value_classes(index, arg)) if isinstance(arg, ast.Call) else ()
        for cls in among:
            ctx.leave("passes-model-to-method", {"owner": owner, "method": func.attr, "position": i,
                                                 "keyword": keyword, "cls": cls, "local": cls in index.classes,
                                                 "among": list(among)})


def _fed_through_callers(index: Index, fed: dict[tuple[ast.AST, int], dict]) -> dict[tuple[ast.AST, int], dict]:
    """A model parameter that feeds a cross-entropy loss in a helper feeds it for every function of the file that
    hands its own parameter on: `train(model, ...)` calls `train_single_epoch(model, ...)`, whose loss reads
    `model(x)`, so position 0 of `train` feeds the loss too. Followed through three calls, module-level functions
    only (what another file can import and call)."""
    out = dict(fed)
    if not fed:
        return out  # most files feed no model parameter to a cross-entropy loss: nothing to follow
    for _ in range(3):
        added = False
        for fn in index.functions.values():
            params = [a.arg for a in fn.args.posonlyargs + fn.args.args]  # type: ignore[attr-defined]
            for call in index.calls_in(fn):
                target = index.local_target(call)
                if target is None or target is fn or not isinstance(index.parent(target), ast.Module):
                    continue
                names = [a.arg for a in target.args.posonlyargs + target.args.args]  # type: ignore[attr-defined]
                handed = [(i, a) for i, a in enumerate(call.args) if not isinstance(a, ast.Starred)]
                handed += [(names.index(k.arg), k.value) for k in call.keywords if k.arg in names]
                for position, arg in handed:
                    loss = out.get((target, position))
                    if loss is None or not isinstance(arg, ast.Name) or arg.id not in params:
                        continue
                    key = (fn, params.index(arg.id))
                    if key not in out:
                        out[key] = loss
                        added = True
        if not added:
            break
    return out


_VALUE = attrgetter("value")
_WRAPPERS = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DistributedDataParallel",
                       "torch.nn.parallel.DataParallel", "torch.compile"})


def _constructed_class(index, expr: ast.AST, depth: int = 0) -> str | None:
    """The class a name was built from (`classifier = model.Classifier().cuda()` -> `model.Classifier`), for a
    class of this file or of another module of the project (not torch's own)."""
    b = index.binding(expr)
    if b is not None and b.kind == "module" and b.cls and not b.cls.startswith("torch."):
        return b.cls
    if isinstance(expr, ast.Name) and expr.id not in index.assigned_names():
        return None  # never assigned: no value to follow, here or in an enclosing function
    value = latest_value(index, expr.id, expr) if isinstance(expr, ast.Name) else None
    if value is None and isinstance(expr, ast.Name):
        value = index.closure_value(expr.id, expr)  # a model built in `main` and run by a closure inside it
    same = index.names["same_object_methods"]
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in same:
        value = value.func.value
    if not isinstance(value, ast.Call):
        return None
    q = index.resolve(value.func) or dotted(value.func)
    if q in _WRAPPERS and value.args and isinstance(value.args[0], ast.Name) and depth < 3:
        # `model = torch.nn.DataParallel(model, gpus)`: the wrapper runs the wrapped model's forward
        return _constructed_class(index, value.args[0], depth + 1)
    if not q or q.split(".", 1)[0] in ("torch", "torchvision", "numpy", "np") or not q.rsplit(".", 1)[-1][:1].isupper():
        return None
    return q


def _constructed_models(ctx: Context, name: ast.Name) -> tuple[str, ...]:
    """`_constructed_classes` of a name handed to a call, asked only when the name could have one: bound to a
    model of a known class, or given a class call (or a choice among classes) by some assignment of the file.
    Most names handed to calls are neither, and the answer for them (none) would otherwise cost the file's whole
    table of assignments by scope."""
    index = ctx.index
    b = index.binding(name)
    if b is None or b.kind != "module" or not b.cls or b.cls.startswith("torch."):
        # the binding test `_constructed_class` starts with fails: only a value can name the class
        if not _may_build_class(ctx, name.id):
            return ()  # whichever of its assignments reaches the call, none names a class
    return _constructed_classes(index, name)


def _may_build_class(ctx: Context, name: str) -> bool:
    """Whether some assignment of the file gives `name` a value `_constructed_class(es)` could accept, asked in
    the file's unordered pass over assignments: most names are given none, and for them the scoped table of
    assignments (`defs`) those functions would build is never needed."""
    built = ctx.memo("module-design:class-built-names", dict)  # name -> whether an assignment builds a class
    if name not in built:
        built[name] = any(_builds_a_class(ctx.index, v) for v in ctx.index.assigned_values().get(name, ()))
    return built[name]


def _builds_a_class(index: Index, value: ast.expr) -> bool:
    """Whether `_constructed_classes` could accept this value: a call, through the same-object methods, of a
    class spelling or of a wrapper (`Net().cuda()`, `nn.DataParallel(model)`, `_netD(ngpu)` when the project
    knows `_netD` is a module), or a choice made at run time (`A() if c else B()`, `{"a": A}[k]()`), which is
    left to `_value_classes` to read."""
    same = index.names["same_object_methods"]
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in same:
        value = value.func.value
    if isinstance(value, ast.IfExp):
        return True
    if not isinstance(value, ast.Call):
        return False
    if isinstance(value.func, ast.Subscript):
        return True
    q = index.resolve(value.func) or dotted(value.func)
    return q in _WRAPPERS or _class_spelling(index, value.func) is not None


def _class_spelling(index, expr: ast.AST) -> str | None:
    """A class named by `expr` (`MLP`, `models.MLP`), of this file or of another module, not torch's own."""
    q = index.resolve(expr) or dotted(expr)
    if not q or q.split(".", 1)[0] in ("torch", "torchvision", "numpy", "np"):
        return None
    if q.rsplit(".", 1)[-1].lstrip("_")[:1].isupper():
        return q
    # `_netD(ngpu, n)` (ACGAN-PyTorch): a lower-case class name, known to be a module by the project's table
    project = getattr(index, "project", None)
    info = index.classes.get(q)
    return q if project is not None and project.is_module_class(q) or info is not None and info.is_module else None


def _branch_values(index, name: str, value: ast.AST) -> list[ast.AST]:
    """`if arch == "cnn": model = CNN() elif ...: model = MLP() else: ...`: the values every branch of the if-chain
    holding `value`'s assignment gives `name` (the model is chosen at run time; each is a candidate)."""
    stmt = index.statement_of(value)
    chain = index.parent(stmt) if stmt is not None else None
    if not isinstance(chain, ast.If):
        return [value]
    while isinstance(index.parent(chain), ast.If) and index.parent(chain).orelse == [chain]:
        chain = index.parent(chain)  # up to the first `if` of an elif chain
    found: list[ast.AST] = []
    node: ast.AST | None = chain
    while isinstance(node, ast.If):
        branches = [node.body] + ([node.orelse] if not (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If))
                                  else [])
        for body in branches:
            for s in body:
                if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                        and s.targets[0].id == name:
                    found.append(s.value)
        node = node.orelse[0] if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If) else None
    return found or [value]


def _value_classes(index, value: ast.AST | None, depth: int = 0) -> list[str]:
    """The classes an expression may build: a class call (`MLP(...).cuda()`), a wrapper around one
    (`nn.DataParallel(MLP())`), either branch of `CNN() if a else MLP()`, or any class of a table of classes
    called by key (`{"cnn": CNN, "mlp": MLP}[arch](...)`)."""
    if value is None or depth > 3:
        return []
    same = index.names["same_object_methods"]
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in same:
        value = value.func.value
    if isinstance(value, ast.IfExp):
        return _value_classes(index, value.body, depth + 1) + _value_classes(index, value.orelse, depth + 1)
    if not isinstance(value, ast.Call):
        return []
    func = value.func
    if isinstance(func, ast.Subscript):
        table = func.value
        if isinstance(table, ast.Name):
            table = latest_value(index, table.id, table) or next(
                (v for _s, v in reversed(index.defs(index.tree).get(table.id, []))), None)
        if isinstance(table, ast.Dict):
            return [q for v in table.values if v is not None and (q := _class_spelling(index, v))]
        return []
    q = index.resolve(func) or dotted(func)
    if q in _WRAPPERS and value.args:
        inner = value.args[0]
        # `torch.nn.DataParallel(model)` / `nn.DataParallel(MLP())`: the wrapper runs the wrapped model's forward
        return list(_constructed_classes(index, inner, depth + 1)) if isinstance(inner, ast.Name) \
            else _value_classes(index, inner, depth + 1)
    found = _class_spelling(index, func)
    return [found] if found else []


def _constructed_classes(index, expr: ast.AST, depth: int = 0) -> tuple[str, ...]:
    """Every class a name may have been built from: the one `_constructed_class` finds, or, when the model is
    chosen at run time (branches of an if-chain, a conditional expression, a table of classes) or wrapped around
    a call, each candidate. A rule that needs one candidate to end in a softmax asks them all."""
    one = _constructed_class(index, expr, depth)
    if not isinstance(expr, ast.Name) or expr.id not in index.assigned_names() or depth > 3:
        return (one,) if one else ()
    value = latest_value(index, expr.id, expr) or index.closure_value(expr.id, expr)
    if value is None:
        return (one,) if one else ()
    if one and not isinstance(value, ast.IfExp) and not isinstance(index.parent(index.statement_of(value)), ast.If):
        return (one,)  # one class call, on no branch: the common case, settled without the table lookups below
    found: list[str] = []
    for v in _branch_values(index, expr.id, value):
        for q in _value_classes(index, v, depth):
            if q not in found:
                found.append(q)
    if one and one not in found:
        found.insert(0, one)
    return tuple(found)


def attribute_class(index, func: ast.Attribute) -> str | None:
    """The imported class an attribute was built from anywhere in the file (`self.head = heads.Classifier(...)`,
    `module.evaluator = Evaluator(...)` in another method), when every such assignment builds the same class and
    that class is not torch's own."""
    name = dotted(func)
    if name is None:
        return None
    found: set[str] = set()
    for stmt in index.nodes(ast.Assign):
        if not any(dotted(t) == name for t in stmt.targets):  # type: ignore[attr-defined]
            continue
        value = stmt.value  # type: ignore[attr-defined]
        same = index.names["same_object_methods"]
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in same:
            value = value.func.value
        q = index.resolve(value.func) if isinstance(value, ast.Call) else None
        if q is None or q.split(".", 1)[0] in ("torch", "torchvision", "numpy", "np") \
                or not q.rsplit(".", 1)[-1][:1].isupper() or q in index.classes:
            return None
        found.add(q)
    return found.pop() if len(found) == 1 else None


def _model_output(index: Index, expr: ast.AST | None, depth: int = 0) -> tuple[tuple[str, ...], int | None] | None:
    """(the classes it may be, the tuple position) when `expr` is the output of a model built from another module's class:
    `output = model(X)` with `model = ApproxRepSet(...)`, `probs, classes = model(seqs)`, `self.head(x)`."""
    if expr is None or depth > 6:
        return None
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _SAME_VALUES:
        return _model_output(index, expr.func.value, depth + 1)
    position: int | None = None
    if isinstance(expr, ast.Name):
        unpacked = unpacked_from(index, expr.id, expr)
        if unpacked is not None:
            expr, position = unpacked
        else:
            value = latest_value(index, expr.id, expr)
            if not isinstance(value, ast.Call):
                return None
            if isinstance(value.func, ast.Attribute) and value.func.attr in _SAME_VALUES:
                return _model_output(index, value, depth + 1)
            expr = value
    if not isinstance(expr, ast.Call):
        return None
    if isinstance(expr.func, ast.Name):
        among = _constructed_classes(index, expr.func) or _factory_made(index, expr.func)
    elif isinstance(expr.func, ast.Attribute):
        among = tuple(c for c in [attribute_class(index, expr.func)] if c)
    else:
        among = ()
    # a class of this file: the file's own pass follows it; a model chosen at run time keeps every other candidate
    among = tuple(c for c in among if c not in index.classes)
    return (among, position) if among else None


def _factory_made(index: Index, name: ast.Name) -> tuple[str, ...]:
    """`model = build_classifier(30, 6)` with `build_classifier` imported from another module of the project: the
    model that function builds (the project pass knows whether it ends in a softmax, as a "softmax-class" fact)."""
    value = latest_value(index, name.id, name)
    same = index.names["same_object_methods"]
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in same:
        value = value.func.value
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name | ast.Attribute):
        return ()
    q = index.resolve(value.func)
    if q is None or "." not in q or q.split(".", 1)[0] in ("torch", "torchvision", "numpy", "np", "timm") \
            or not q.rsplit(".", 1)[-1][:1].islower() or index.binding(name) is not None and index.binding(
                name).kind not in ("module", None):
        return ()
    return (q,)


def _leave_softmax_factories(ctx: Context) -> None:
    """For the project pass: a module-level function whose every `return` is an `nn.Sequential(...)` ending in
    `nn.Softmax` (built in the return or bound to a name it returns): the model it builds ends in a softmax."""
    index = ctx.index
    if "torch.nn.Softmax" not in index.calls_by_name or "torch.nn.Sequential" not in index.calls_by_name:
        # neither layer is called here (the calls index files each call under the name `resolve` gives it): no
        # return can be one, and following every function's returned names would build the table of assignments
        return
    for name, fn in index.functions.items():
        if not isinstance(index.parent(fn), ast.Module):
            continue
        returns = index.returns_of(fn)
        lasts = []
        for r in returns:
            built = latest_value(index, r.id, r) if isinstance(r, ast.Name) else r
            if not (isinstance(built, ast.Call) and index.resolve(built.func) == "torch.nn.Sequential" and built.args):
                break
            last = built.args[-1]
            if not (isinstance(last, ast.Call) and index.resolve(last.func) == "torch.nn.Softmax"):
                break
            lasts.append(last)
        else:
            if lasts:
                ctx.leave("softmax-class", {"class": name, "kind": "softmax", "position": None, "factory": True,
                                            "line": lasts[0].lineno, "col": lasts[0].col_offset + 1})


def _built_classes(ctx: Context) -> dict[str, str]:
    """Names and attributes the file assigns from a class call, by their dotted name (`criterion`,
    `self.loss_fn`), when every assignment of that name builds the same class: worked out once per file, so that
    asking it of every call stays cheap."""
    def build() -> dict[str, str]:
        index = ctx.index
        same = index.names["same_object_methods"]
        found: dict[str, set[str | None]] = {}
        # Only a name some call of the file ends in is ever asked (`_imported_class_called`): the last parts of the
        # calls' names (an imported name is called under its alias), so that the assignments of the file's other
        # names, most of them, are skipped before their value is resolved.
        called = {*index.calls_by_method, *(n.rsplit(".", 1)[-1] for n in index.calls_by_name), *index.aliases,
                  *index.vocab["conventional_aliases"]}
        name_cls, attribute_cls = ast.Name, ast.Attribute
        for stmt in index.nodes(ast.Assign):
            if len(stmt.targets) == 1:  # type: ignore[attr-defined]
                t = stmt.targets[0]  # type: ignore[attr-defined]
                if (t.id if t.__class__ is name_cls else t.attr if t.__class__ is attribute_cls else None) not in called:
                    continue
            value = stmt.value  # type: ignore[attr-defined]
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in same:
                value = value.func.value
            q = (index.resolve(value.func) or dotted(value.func)) if isinstance(value, ast.Call) else None
            if q and (q.split(".", 1)[0] in ("torch", "torchvision", "numpy", "np")
                      or not q.rsplit(".", 1)[-1][:1].isupper()):
                q = None
            for target in stmt.targets:  # type: ignore[attr-defined]
                name = dotted(target)
                if name:
                    found.setdefault(name, set()).add(q)
        return {name: next(iter(qs)) for name, qs in found.items() if len(qs) == 1 and None not in qs}
    return ctx.memo("module-design:built-classes", build)


def _imported_class_called(ctx: Context, call: ast.Call) -> str | None:
    """The other module's class whose instance `call` calls (`criterion = CrossEntropy2d().cuda()`)."""
    name = dotted(call.func) if isinstance(call.func, ast.Name | ast.Attribute) else None
    cls = _built_classes(ctx).get(name) if name else None
    return None if cls is None or cls in ctx.index.classes else cls


def _leave_loss_inputs(ctx: Context, kinds: dict[ast.Call, str]) -> None:
    """For the project pass: a loss call whose input or whose loss is another file's business. Either the loss is
    a cross-entropy of this file and its input another module's model output, or the loss is another module's
    class and its input a softmax of this file or another module's model output."""
    index = ctx.index
    built = _built_classes(ctx)
    if not kinds and not built:
        return  # no loss call and no name built from a class: no call here is a loss
    # A call can be of a built name only when it ends like one (`self.loss_fn(...)`, `criterion(...)`): the last
    # part is read off the node, the dotted name worked out only for those calls.
    tails = {name.rsplit(".", 1)[-1] for name in built}
    name_cls, attribute_cls = ast.Name, ast.Attribute
    for call in index.nodes(ast.Call):
        kind = kinds.get(call)  # type: ignore[call-overload]
        func = call.func  # type: ignore[attr-defined]
        tail = func.id if func.__class__ is name_cls else func.attr if func.__class__ is attribute_cls else None
        loss_cls = None if kind is not None or tail not in tails else _imported_class_called(ctx, call)  # type: ignore[arg-type]
        if kind is None and loss_cls is None:
            continue
        inputs = kwarg(call, "input", 0)  # type: ignore[arg-type]
        if inputs is None:
            continue
        fact = {"loss": ctx.segment(call.func, 40), "loss_line": call.lineno,  # type: ignore[attr-defined]
                "loss_kind": kind, "loss_cls": loss_cls, "variable": ctx.segment(inputs, 40)}
        if loss_cls is not None:
            local = [(k, o) for k in ("softmax", "log_softmax")
                     if (o := probabilities_origin(index, inputs, call, kinds=frozenset({k}))) is not None]
            if local:
                softmax, origin = local[0]
                ctx.leave("loss-input", {**fact, "origin_kind": softmax, "line": origin.lineno,
                                         "col": origin.col_offset + 1})
                continue
        output = _model_output(index, inputs)
        if output is not None:
            ctx.leave("loss-input", {**fact, "model_cls": output[0][0], "among": list(output[0]),
                                     "position": output[1]})


def _leave_criterion_parameters(ctx: Context) -> None:
    """For the project pass, the two halves of `train(model, loader, optimizer, criterion)`: a module-level function
    that feeds its model parameter's output to its criterion parameter (`loss = criterion(model(x), y)`), and a call
    of another module's function that hands it a model of a known class and a cross-entropy or NLL loss."""
    index = ctx.index
    top = {id(stmt) for stmt in index.tree.body}  # a module-level function is a statement of the module's body
    wanted = {fn: [a.arg for a in fn.args.posonlyargs + fn.args.args]  # type: ignore[attr-defined]
              for fn in index.functions.values() if id(fn) in top}
    # `criterion(...)` with `criterion` a parameter: one pass over the file's calls picks the calls of a name some
    # such function takes, and only those are asked which function they sit in
    names = {p for params in wanted.values() for p in params}
    called: dict[ast.AST, list[ast.Call]] = {}
    name_cls = ast.Name
    # the calls indexed under those names (a plain name, unless an import of the same name resolves it otherwise)
    aliased = names & (index.aliases.keys() | index.vocab["conventional_aliases"].keys())
    for call in (index.nodes(ast.Call) if aliased else index.calls_to(*names)) if names else ():
        func = call.func  # type: ignore[attr-defined]
        if func.__class__ is name_cls and func.id in names and call.args:  # type: ignore[attr-defined]
            fn = index.function_of(call)
            if fn in wanted and func.id in wanted[fn]:
                called.setdefault(fn, []).append(call)  # type: ignore[arg-type]
    for fn, params in wanted.items():
        # each function's calls in source order, as `calls_in` gives them
        for call in sorted(called.get(fn, ()), key=stmt_position):
            made = call.args[0]
            if isinstance(made, ast.Name):
                # `criterion(outputs, y)`: only a name ever assigned a call can hold `model(x)`; asking any other
                # where it was assigned would build the file's table of assignments by scope for nothing
                made = latest_value(index, made.id, made) if index.assigned_a(made.id, ast.Call) else None
            while isinstance(made, ast.Call) and isinstance(made.func, ast.Attribute) \
                    and made.func.attr in _SAME_VALUES:
                made = made.func.value
            if isinstance(made, ast.Call) and isinstance(made.func, ast.Name) and made.func.id in params \
                    and made.func.id != call.func.id:
                ctx.leave("criterion-on-param", {"function": fn.name,  # type: ignore[attr-defined]
                                                 "position": params.index(made.func.id),
                                                 "loss_position": params.index(call.func.id),
                                                 "loss": call.func.id, "line": call.lineno})
    if not any(bs[-1].kind == "loss" and bs[-1].cls in _LOSS_CLASSES for bs in index.bindings.values() if bs):
        return  # no name's binding is a cross-entropy or NLL loss: no call below can hand one over
    for call in index.nodes(ast.Call):
        if len(call.args) < 2 or isinstance(call.func, ast.Name) and call.func.id in index.functions:  # type: ignore[attr-defined]
            continue
        names = [(i, a) for i, a in enumerate(call.args) if isinstance(a, ast.Name)]  # type: ignore[attr-defined]
        if len(names) < 2:
            continue  # two names handed over, a model and a loss, before the callee is worth resolving
        q = index.resolve(call.func)  # type: ignore[attr-defined]
        if q is None or "." not in q or q.split(".", 1)[0] in ("torch", "torchvision", "numpy", "np"):
            continue
        args: dict[int, dict] = {}
        for i, arg in names:
            b = index.binding(arg)
            if b is not None and b.kind == "loss" and b.cls in _LOSS_CLASSES:
                args[i] = {"loss": _LOSS_CLASSES[b.cls]}
        if not args:
            continue  # no cross-entropy or NLL handed over: most calls
        for i, arg in names:
            among = _constructed_classes(index, arg) if i not in args else ()
            if among:
                args[i] = {"cls": among[0], "local": among[0] in index.classes,
                           "among": [[c, c in index.classes] for c in among]}
        if any("cls" in a for a in args.values()):
            ctx.leave("hands-model-and-loss", {"callee": q, "args": {str(i): a for i, a in args.items()}})


_EXPECTS = {"cross_entropy": "logits: it applies log_softmax itself, so the softmax is applied twice",
            "nll": "log-probabilities (log_softmax output), not probabilities"}


def _softmax_loss_hits(project: Project, softmax: str) -> list[ProjectHit]:
    """Joins a model class whose forward ends in `softmax` (or log_softmax) with the loss its output reaches in
    another file: through a call handing the model to a function that feeds it to the loss, through an attribute
    or name built from the class, or through a loss class of another module."""
    classes: dict[tuple[str, str, int | None], tuple] = {}
    for f, fact in project.facts("softmax-class"):
        if fact.get("kind", "softmax") == softmax:
            classes.setdefault((f.module, fact["class"], fact.get("position")), (f, fact))
    wrappers = {(f.module, fact["class"]): fact["kind"] for f, fact in project.facts("loss-class")}
    wanted = ("cross_entropy",) if softmax == "log_softmax" else ("cross_entropy", "nll")
    hits: dict[tuple[str, int], ProjectHit] = {}

    def class_hit(owner: tuple[str, str], position: int | None, loss: str, where: str, loss_kind: str,
                  among: list | None = None) -> None:
        if (*owner, position) not in classes:
            return
        g, cls = classes[(*owner, position)]
        # a model chosen at run time among several classes: this one is a candidate, and one that ends in a
        # softmax is enough for the loss to see probabilities whenever it is chosen
        others = [a.rsplit(".", 1)[-1] for a in among or () if a.rsplit(".", 1)[-1] != cls["class"]]
        chosen = (f" The model is chosen at run time; {cls['class']} is one of its candidates (also "
                  f"{', '.join(others)}).") if others else ""
        if softmax == "log_softmax":
            values = {"variable": f"{cls['class']}'s output", "loss": loss,
                      "remedy": _log_softmax_remedy(loss, where) + chosen}
        elif cls.get("factory"):
            values = {"variable": f"the output of the model {cls['class']}() builds", "loss": loss,
                      "expects": _EXPECTS[loss_kind],
                      "remedy": f"Drop the final nn.Softmax from the nn.Sequential {cls['class']}() builds (the loss "
                                f"is `{loss}` {where}); keep softmax only for reporting probabilities." + chosen}
        else:
            values = {"variable": f"{cls['class']}'s output", "loss": loss, "expects": _EXPECTS[loss_kind],
                      "remedy": f"Return the raw logits from {cls['class']}.forward and drop the softmax (the loss "
                                f"is `{loss}` {where}); keep softmax only for reporting probabilities." + chosen}
        hits.setdefault((g.path, cls["line"]), ProjectHit(g.path, cls["line"], cls["col"], values))

    if classes:
        losses = {(f.module, fact["function"], fact["position"]): fact for f, fact in project.facts("loss-on-param")}
        # a constructor's parameter by its name too, for `Trainer(model=MLP())`
        losses.update({(f.module, fact["function"], fact["param"]): fact for f, fact in project.facts("loss-on-param")
                       if fact.get("param")})
        for f, fact in project.facts("loss-on-class-output"):
            for g, name in project.defining(fact["cls"], below=True):
                class_hit((g.module, name), None, fact["loss"], f"in {f.path}, line {fact['line']}", "cross_entropy")
        for f, fact in project.facts("passes-model"):
            targets = [(f.module, fact["callee"])] if fact.get("callee_local") else \
                [(g.module, name) for g, name in project.defining(fact["callee"])]
            key = fact["position"] if fact["position"] is not None else fact.get("keyword")
            loss = next((losses[(m, n, key)] for m, n in targets if (m, n, key) in losses), None)
            if loss is None:
                continue
            owners = [(f.module, fact["cls"])] if fact["local"] else \
                [(g.module, name) for g, name in project.defining(fact["cls"])]
            for owner in owners:
                class_hit(owner, None, loss["loss"], f"in `{fact['callee']}`, line {loss['line']}", "cross_entropy",
                          fact.get("among"))
        methods = {(f.module, fact["class"], fact["method"], key): fact for f, fact in project.facts("loss-on-method-param")
                   for key in (fact["position"], fact["param"])}
        for f, fact in project.facts("passes-model-to-method") if methods else ():
            key = fact["position"] if fact["position"] is not None else fact["keyword"]
            for g, name in project.defining(fact["owner"]):
                loss = methods.get((g.module, name, fact["method"], key))
                if loss is None:
                    continue
                owners = [(f.module, fact["cls"])] if fact["local"] else \
                    [(h.module, n) for h, n in project.defining(fact["cls"], below=True)]
                for owner in owners:
                    class_hit(owner, None, loss["loss"], f"in `{name}.{fact['method']}`, {g.path} line {loss['line']}",
                              "cross_entropy", fact.get("among"))
    criteria = {(f.module, fact["function"]): fact for f, fact in project.facts("criterion-on-param")}
    for f, fact in project.facts("hands-model-and-loss") if criteria else ():
        for g, name in project.defining(fact["callee"]):
            fed = criteria.get((g.module, name))
            model = fact["args"].get(str(fed["position"])) if fed else None
            loss = fact["args"].get(str(fed["loss_position"])) if fed else None
            if fed is None or model is None or loss is None or "cls" not in model or loss.get("loss") not in wanted:
                continue
            among = model.get("among") or [[model["cls"], model["local"]]]
            owners = [o for cls, local in among for o in ([(f.module, cls)] if local else
                      [(h.module, n) for h, n in project.defining(cls, below=True)])]
            for owner in owners:
                class_hit(owner, None, fed["loss"], f"in `{fact['callee']}`, {g.path} line {fed['line']}",
                          loss["loss"], [c for c, _local in among])
    for f, fact in project.facts("loss-input"):
        loss_kind = fact.get("loss_kind")
        if loss_kind is None:
            loss_kind = next((wrappers[(g.module, name)] for g, name in project.defining(fact["loss_cls"], below=True)
                              if (g.module, name) in wrappers), None)
        if loss_kind not in wanted:
            continue
        if fact.get("origin_kind") is not None:
            if fact["origin_kind"] != softmax:
                continue
            if softmax == "log_softmax":
                values = {"variable": fact["variable"], "loss": fact["loss"],
                          "remedy": _log_softmax_remedy(fact["loss"], f"line {fact['loss_line']}")
                          + f" `{fact['loss']}` is a {fact['loss_cls']} whose forward applies cross-entropy."}
            else:
                values = {"variable": fact["variable"], "loss": fact["loss"], "expects": _EXPECTS[loss_kind],
                          "remedy": f"Pass the raw logits to `{fact['loss']}` (a {fact['loss_cls']}, whose forward "
                                    f"applies the loss) and drop the softmax."}
            hits.setdefault((f.path, fact["line"]), ProjectHit(f.path, fact["line"], fact["col"], values))
            continue
        among = fact.get("among") or [fact["model_cls"]]
        for model_cls in among:
            for g, name in project.defining(model_cls, below=True):
                class_hit((g.module, name), fact.get("position"), fact["loss"],
                          f"in {f.path}, line {fact['loss_line']}", loss_kind, among)
    return list(hits.values())


@project("TD205")
def softmax_model_trained_with_cross_entropy(project: Project) -> list[ProjectHit]:
    """main.py builds `model.Classifier()` and hands it to `train.source_only(encoder, classifier, ...)`, which
    feeds `classifier(x)` to CrossEntropyLoss; Classifier's forward ends in softmax (model.py)."""
    return _softmax_loss_hits(project, "softmax")


@project("TD210")
def log_softmax_model_trained_with_cross_entropy(project: Project) -> list[ProjectHit]:
    """models.py's forward returns `F.log_softmax(out, dim=1)`; main.py feeds `model(X)` to `F.cross_entropy`."""
    return _softmax_loss_hits(project, "log_softmax")


@rule("TD206", ast.BinOp, ast.Call, callees=("torch.matmul", "torch.bmm"), ops=(ast.MatMult,))
def manual_attention(node: ast.AST, ctx: Context) -> None:
    index = ctx.index
    if isinstance(node, ast.BinOp):
        if not isinstance(node.op, ast.MatMult):
            return
        probs = node.left
    else:
        if index.callee(node) not in ("torch.matmul", "torch.bmm") or len(node.args) < 2:  # type: ignore[arg-type]
            return
        probs = node.args[0]  # type: ignore[attr-defined]
    if not ctx.torch_at_least(2, 0):
        return  # scaled_dot_product_attention arrived in 2.0
    if not attention_probs(index, probs, node):
        return
    fn = index.function_of(node)
    if fn is not None:
        if ctx.memo(("calls-sdpa", fn), lambda: _calls_sdpa(index, fn)):
            return  # a fallback branch next to the fused path (nanoGPT's `if self.flash:`)
        if isinstance(probs, ast.Name) and _weights_needed(fn, probs.id):
            return
    name = probs.id if isinstance(probs, ast.Name) else "softmax(...)"
    ctx.report(node, variable=name, expr=ctx.segment(node, 60))


def _calls_sdpa(index: Index, fn: ast.AST) -> bool:
    for call in index.calls_to("torch.nn.functional.scaled_dot_product_attention"):
        if index.function_of(call) is fn:
            return True
    return False


def _weights_needed(fn: ast.AST, name: str) -> bool:
    """The attention weights are returned, stored or collected: SDPA does not return them."""
    for sub in subtree(fn):
        if isinstance(sub, ast.Return) and sub.value is not None:
            if any(isinstance(n, ast.Name) and n.id == name for n in subtree(sub.value)):
                return True
        elif isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Name) and sub.value.id == name:
            if any(isinstance(t, ast.Attribute) for t in sub.targets):
                return True
        elif isinstance(sub, ast.Call) and last_name(sub.func) in ("append", "extend") and any(
            isinstance(a, ast.Name) and a.id == name for a in sub.args
        ):
            return True
    return False


@rule("TD207", ast.ClassDef)
def tensor_parameter_not_registered(node: ast.ClassDef, ctx: Context) -> None:
    info = _module_class(ctx, node)
    if info is None:
        return
    index = ctx.index
    registered = _registered_attrs(index, info)
    reported: set[str] = set()
    for a in index.self_assignments(info, None):
        if a.attr in registered or a.attr in reported:
            continue
        if tensor_factory(index, a.value) is None or not requires_grad_in_chain(a.value):
            continue
        reported.add(a.attr)
        ctx.report(a.stmt, variable=f"self.{a.attr}", value=ctx.segment(a.value, 50))


@rule("TD208", ast.Call, callees=lambda: vocabulary()["names"]["stateful_layers"])
def layer_created_in_forward(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    q = index.callee(node)
    if q is None or q not in index.names["stateful_layers"]:
        return
    info = index.forward_of(node)
    if info is None:
        return
    parent = index.parent(node)
    if isinstance(parent, ast.Assign) and any(
        isinstance(t, ast.Attribute) and dotted(t.value) == "self" for t in parent.targets
    ):
        return  # lazily building a submodule: assigning it to self registers it
    ctx.report(node, variable=ctx.segment(node, 50), layer=q.rsplit(".", 1)[-1], cls=info.name)


@rule("TD209", ast.Call, callees=lambda: vocabulary()["names"]["functional_dropout"])
def functional_dropout_ignores_eval(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    q = index.callee(node)
    if q is None or q not in index.names["functional_dropout"]:
        return
    if any(kw.arg == "training" or kw.arg is None for kw in node.keywords) or len(node.args) >= 3:
        return
    info = index.class_of(node)
    if info is None or not info.is_module:
        return
    fn = index.function_of(node)
    if fn is None or fn.name == "__init__":
        return
    for anc in index.ancestors(node):
        if anc is fn:
            break
        if isinstance(anc, ast.If | ast.IfExp) and any(
                isinstance(n, ast.Attribute) and n.attr == "training" for n in subtree(anc.test)):
            return  # `if self.training and rate > 0: x = F.dropout(x, rate)`: runs in training mode only
    if _rate_follows_mode(index, fn, kwarg(node, "p", 1)):
        return
    if _rate_left_at_zero(index, info, kwarg(node, "p", 1)) or _never_runs(index, info, node, fn):
        return
    if index.grad_disabled(node):
        return  # sampling code under no_grad (latent-diffusion's `noise_dropout` in p_sample): dropout there is the point
    # A rate the caller hands in (`def forward(self, x, drop_prob)`) with no call of the method in this file: the
    # caller may pass 0 when it evaluates (pytorch_RVAE's decoder). The claim rests on calls we cannot see: info.
    weak = _rate_from_unseen_callers(index, info, fn, kwarg(node, "p", 1))
    ctx.report(node, severity="info" if weak else None, variable=ctx.segment(node.func), cls=info.name)


def _rate_from_unseen_callers(index: Index, info, fn: ast.AST, rate: ast.AST | None) -> bool:
    """The rate is a parameter of the method (with no default, or a default of 0) and nothing in the file calls
    the method by name: what evaluation passes is decided elsewhere."""
    if not isinstance(rate, ast.Name) or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    args = fn.args.posonlyargs + fn.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(fn.args.defaults):]], fn.args.defaults, strict=True))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d})
    if rate.id not in [a.arg for a in args + fn.args.kwonlyargs]:
        return False
    if any(isinstance(n, ast.Name) and n.id == rate.id and isinstance(n.ctx, ast.Store) for n in subtree(fn)):
        return False  # rebound inside the method: not simply the caller's value
    default = defaults.get(rate.id)
    if default is not None and not (isinstance(default, ast.Constant) and default.value in (0, 0.0)):
        return False  # `def forward(self, x, p=0.3)`: the rate a plain call gets is this file's constant
    if fn.name == "forward":  # called through the module object: built in this file, its calls are here too
        return not any(isinstance(c.func, ast.Name) and c.func.id == info.name for c in index.nodes(ast.Call))
    return not index.callers(fn) and not index.method_calls(fn.name)


def _never_runs(index: Index, info, node: ast.AST, fn: ast.AST) -> bool:
    """Under `if self.mask_cond_ratio is not None:` (or `if self.flag:`) where this file only ever sets that
    attribute to None or False (DDSP-SVC's NaiveV2Diff): the branch is dead code."""
    child = node
    for anc in index.ancestors(node):
        if anc is fn:
            return False
        if isinstance(anc, ast.If) and any(child is stmt for stmt in anc.body):
            tests = anc.test.values if isinstance(anc.test, ast.BoolOp) and isinstance(anc.test.op, ast.And) \
                else [anc.test]
            for test in tests:
                attr = test.left if isinstance(test, ast.Compare) and len(test.ops) == 1 and \
                    isinstance(test.ops[0], ast.IsNot) and is_constant(test.comparators[0], None) else test
                if isinstance(attr, ast.Attribute) and dotted(attr.value) == "self" and _always_unset(index, attr.attr):
                    return True
        child = anc
    return False


def _always_unset(index: Index, attr: str) -> bool:
    """Every assignment to `.attr` in the file stores None or False (and there is at least one)."""
    stores = [n for n in index.nodes(ast.Attribute) if n.attr == attr and isinstance(n.ctx, ast.Store)]
    if not stores:
        return False
    for target in stores:
        stmt = index.parent(target)
        if not isinstance(stmt, ast.Assign | ast.AnnAssign) or stmt.value is None:
            return False
        value = stmt.value
        if isinstance(value, ast.Tuple):
            return False  # `self.a, self.b = ...`: not read here
        if not (is_constant(value, None) or is_constant(value, False)):
            return False
    return True


def _rate_left_at_zero(index: Index, info, rate: ast.AST | None) -> bool:
    """`self.dropout_prob = do_prob` with `do_prob=0.` in `__init__`, and every construction of the class in this
    file leaves it at that default (uvadlc's NRI `MLPDecoder(n_in_node=dims, ...)`): p is 0 in either mode."""
    if not (isinstance(rate, ast.Attribute) and dotted(rate.value) == "self"):
        return False
    init = info.method("__init__")
    if init is None:
        return False
    sets = [a for a in index.self_assignments(info, None) if a.attr == rate.attr]
    if len(sets) != 1 or sets[0].method is not init or not isinstance(sets[0].value, ast.Name):
        return False
    param = sets[0].value.id
    positional = init.args.posonlyargs + init.args.args
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(init.args.defaults):]], init.args.defaults,
                        strict=True))
    defaults.update({a.arg: d for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True) if d})
    default = defaults.get(param)
    if not (isinstance(default, ast.Constant) and default.value in (0, 0.0) and not isinstance(default.value, bool)):
        return False
    position = [a.arg for a in positional].index(param) - 1 if param in [a.arg for a in positional] else None
    if any(info.name in [dotted(b) for b in c.node.bases] for c in index.module_classes):
        return False  # a subclass may pass a rate up through super().__init__
    built = [c for c in index.nodes(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == info.name]
    if not built:
        return False  # built elsewhere: we cannot see the rate it gets
    for call in built:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(kw.arg is None for kw in call.keywords):
            return False
        if kwarg(call, param, position) is not None:
            return False
    return True


def _rate_follows_mode(index: Index, fn: ast.AST, rate: ast.AST | None) -> bool:
    """The rate is a parameter, and every call of the method passes one that reads the mode
    (`dropout_p=0.0 if not self.training else self.config.attention_dropout`, OLMo): in eval mode p is 0."""
    if not isinstance(rate, ast.Name) or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    params = [a.arg for a in fn.args.args]
    if rate.id not in params:
        return False
    position = params.index(rate.id) - (1 if params and params[0] == "self" else 0)
    # An override (OLMoLlamaBlock's) is called through the base class's `self._scaled_dot_product_attention(...)`.
    callers = index.callers(fn) or [c for c in index.method_calls(fn.name)
                                    if isinstance(c.func, ast.Attribute) and dotted(c.func.value) == "self"]
    if not callers:
        return False
    for call in callers:
        passed = kwarg(call, rate.id, position)
        if passed is None or not any(isinstance(n, ast.Attribute) and n.attr == "training" for n in subtree(passed)):
            return False
    return True

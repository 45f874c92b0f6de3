"""Expression-level questions several rules ask, answered through the index.

Small, bounded data flow inside one function: a name is followed to its
latest assignment before the point asked about (at most `DEPTH` hops), never
across functions. Every helper returns False/None when unsure.
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.index import Index, dotted, kwarg, last_name
from torchdoctor.rules.static.semantic.layerstack import last_layer
from torchdoctor.rules.static.semantic.subtree import subtree

DEPTH = 12

SOFTMAX = frozenset({"torch.nn.functional.softmax", "torch.softmax", "torch.special.softmax"})
LOG_SOFTMAX = frozenset({"torch.nn.functional.log_softmax", "torch.log_softmax", "torch.special.log_softmax"})
# What a value holds after a softmax-like last step: probabilities (softmax) or log-probabilities (log_softmax).
# Rules pass the kinds they ask about; the default, probabilities, is what most of them mean.
PROBABILITIES = frozenset({"softmax"})
LOG_PROBABILITIES = frozenset({"log_softmax"})
_KIND_FUNCTIONS = {"softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX}
_KIND_LAYERS = {"softmax": "torch.nn.Softmax", "log_softmax": "torch.nn.LogSoftmax"}
DROPOUT = frozenset({"torch.nn.functional.dropout", "torch.dropout"})
MATMUL = frozenset({"torch.matmul", "torch.bmm", "torch.einsum", "torch.mm"})
# Torch functions that create a tensor from nothing (no autograd history).
TENSOR_FACTORIES = frozenset(
    f"torch.{n}"
    for n in (
        "tensor as_tensor from_numpy ones zeros empty full eye arange linspace logspace rand randn randint "
        "randperm ones_like zeros_like full_like empty_like rand_like randn_like tril triu"
    ).split()
)
# Methods that keep a tensor's autograd history (the result still holds the graph).
KEEPS_GRAPH = frozenset(
    "sum mean cpu cuda to float double half bfloat16 clone view reshape squeeze unsqueeze flatten mul div add "
    "sub pow abs norm sqrt exp log neg contiguous permute transpose type_as expand repeat".split()
)
# Methods and attributes whose result holds no graph.
DROPS_GRAPH = frozenset(
    "item detach detach_ tolist numpy argmax argmin size dim numel nonzero eq ne lt gt le ge bool long int "
    "data grad shape dtype device ndim requires_grad is_cuda".split()
)
LOSS_NAME_WORDS = ("criterion", "loss_fn", "loss_func", "lossfn", "compute_loss", "loss_function")


def latest_value(index: Index, name: str, at: ast.AST) -> ast.expr | None:
    values = index.definitions(name, at)
    return values[-1] if values else None


def is_loss_callable(index: Index, func: ast.AST) -> bool:
    """`criterion`, `loss_fn`, an `nn.*Loss()` binding, or `F.cross_entropy` and friends."""
    b = index.binding(func)
    if b is not None:
        return b.kind == "loss"
    q = index.resolve(func) or ""
    if q.startswith("torch.nn.functional.") and ("loss" in q or q.endswith(("cross_entropy", "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits"))):
        return True
    name = (last_name(func) or "").lower()
    return name.endswith(LOSS_NAME_WORDS) or name.endswith("_loss")


def holds_graph(index: Index, expr: ast.AST | None, at: ast.AST, backward_names: set[str], *,
                device_only: bool = False) -> bool:
    """Whether `expr` is (built from) a tensor that still holds its autograd graph at `at`:
    a name `.backward()` is called on, a model's or a loss function's output computed with grad
    enabled, or arithmetic on those."""
    # device_only: whether the value is a tensor on the device at all (a host read of it waits for the GPU), so a
    # loss function's detached statistics beside the loss still count.
    return bool(_graph(index, expr, at, backward_names, 0, device_only))


def _graph(index: Index, expr: ast.AST | None, at: ast.AST, backward_names: set[str], depth: int,
           device_only: bool = False) -> bool | None:
    """True / False, or None when the expression's origin is unknown."""
    if expr is None or depth > DEPTH:
        return None
    if isinstance(expr, ast.Name):
        if not device_only and _unpacked_beside_the_loss(index, expr, backward_names):
            return False
        elements = _returned_elements(index, expr) if depth < DEPTH - 1 and not device_only else None
        if elements is not None:  # `loss, elapsed = dknn_loss(...)`: what that function returns in this position
            found = [_graph(index, e, e, backward_names, depth + 2, device_only) for e in elements]
            if any(found):
                return True
            if all(f is False for f in found):
                return False
            stmt = _unpacking_of(index, expr)
            if not (stmt is not None and isinstance(stmt.value, ast.Call) and index.is_model(stmt.value.func)):
                return None  # a helper's result we cannot read; a model's output position left unknown holds its graph
        value = latest_value(index, expr.id, expr)
        if value is None:
            value = _loop_element(index, expr, at)
        known = _graph(index, value, value, backward_names, depth + 1, device_only) if value is not None else None
        if known is not None:
            return known
        return True if expr.id in backward_names else None
    if isinstance(expr, ast.Constant):
        return False
    if isinstance(expr, ast.BinOp):
        left = _graph(index, expr.left, at, backward_names, depth + 1, device_only)
        right = _graph(index, expr.right, at, backward_names, depth + 1, device_only)
        if left or right:
            return True
        return False if left is False and right is False else None
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub | ast.UAdd):
        return _graph(index, expr.operand, at, backward_names, depth + 1, device_only)
    if isinstance(expr, ast.Subscript):
        return _graph(index, expr.value, at, backward_names, depth + 1, device_only)
    if isinstance(expr, ast.Attribute):
        if expr.attr in DROPS_GRAPH:
            return False
        if expr.attr in ("loss", "logits"):  # Hugging Face model outputs
            return _graph(index, expr.value, at, backward_names, depth + 1, device_only)
        return None
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Attribute):
            if func.attr in DROPS_GRAPH:
                return False
            if func.attr in KEEPS_GRAPH:
                return _graph(index, func.value, at, backward_names, depth + 1, device_only)
        if isinstance(func, ast.Name) and func.id in ("float", "int", "len", "round", "str", "bool"):
            return False
        if index.is_model(func) or is_loss_callable(index, func):
            return not index.grad_disabled(expr)
        target = index.local_target(expr)
        if target is not None and depth < DEPTH - 1:
            # `loss_each = self.train_one_batch(images, targets)`: what that method returns. A name the method
            # itself ran the backward on holds the graph when it is returned (DeblurGANv2's `_update_d`:
            # `loss_D.backward(retain_graph=True)`, `return loss_D`).
            returns = index.returns_of(target)
            if not device_only and any(isinstance(r, ast.Name) and r.id in _own_backward_names(index, target)
                                       for r in returns):
                return True
            found = [_graph(index, r, r, backward_names, depth + 2, device_only) for r in returns]
            if any(found):
                return True
            if found and all(f is False for f in found):
                return False
    return None


def _unpacking_of(index: Index, name: ast.Name) -> ast.Assign | None:
    """The tuple-unpacking assignment (`a, b = f(...)`) that last set `name` before it is read, if that is what did."""
    stmt_here = index.statement_of(name) or name
    here = (getattr(stmt_here, "lineno", 0), getattr(stmt_here, "col_offset", 0))
    found = [s for s, _v in index.defs(index.scope_of(name)).get(name.id, []) if (s.lineno, s.col_offset) < here]
    stmt = found[-1] if found else None
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Tuple):
        return None
    return stmt


def _returned_elements(index: Index, name: ast.Name) -> list[ast.expr] | None:
    """`losses, timing = dknn_loss(q, n)` with `def dknn_loss(...): ... return loss, elapsed` in this file: the
    expressions the function returns in `timing`'s position (None when that cannot be read)."""
    stmt = _unpacking_of(index, name)
    if stmt is None or not isinstance(stmt.value, ast.Call):
        return None
    targets = stmt.targets[0].elts  # type: ignore[attr-defined]
    position = next((i for i, e in enumerate(targets) if isinstance(e, ast.Name) and e.id == name.id), None)
    if position is None or any(isinstance(e, ast.Starred) for e in targets):
        return None
    target = index.local_target(stmt.value) or _local_forward(index, stmt.value)
    returns = index.returns_of(target) if target is not None else []
    if not returns or not all(isinstance(r, ast.Tuple) and len(r.elts) == len(targets) and
                              not any(isinstance(e, ast.Starred) for e in r.elts) for r in returns):
        return None
    return [r.elts[position] for r in returns]  # type: ignore[attr-defined]


def _local_forward(index: Index, call: ast.Call) -> ast.AST | None:
    """`res, loss, acc, nll, ppl, n, bsz = model(**inputs)` where `model` is a module of a class this file defines
    (textgen's SongNet): that class's `forward`, whose returned tuple says what each position holds."""
    func = call.func
    if not isinstance(func, ast.Name | ast.Attribute):
        return None
    b = index.binding(func)
    if b is None or b.kind != "module" or not b.cls:
        return None
    info = index.classes.get(b.cls)
    return info.method("forward") if info is not None else None


def _unpacked_beside_the_loss(index: Index, name: ast.Name, backward_names: set[str]) -> bool:
    """`ppo_loss, stats = self.compute_loss(batch)` then `backward(ppo_loss)`: a loss function's other results
    (counts, logged stats) are not the graph holder; the one the backward runs on is. A model's outputs are
    different: `loss, logits = model(x)` both carry the graph."""
    if name.id in backward_names:
        return False
    stmt = _unpacking_of(index, name)
    if stmt is None:
        return False
    value = stmt.value
    if not isinstance(value, ast.Call) or index.is_model(value.func) or not is_loss_callable(index, value.func):
        return False
    return any(isinstance(e, ast.Name) and e.id != name.id and e.id in backward_names for e in stmt.targets[0].elts)


def unpacked_beside_the_loss_from_elsewhere(index: Index, name: ast.Name, backward_names: set[str]) -> bool:
    """`loss, loss_components = compute_loss(outputs, targets, model)` with `compute_loss` imported from another
    file (PyTorch-YOLOv3): the other results sit beside the loss the step backpropagates, and whether they are
    still on the device (or already `.cpu()`, as there) is decided in a body this file does not show."""
    if not _unpacked_beside_the_loss(index, name, backward_names):
        return False
    stmt = _unpacking_of(index, name)
    return stmt is not None and isinstance(stmt.value, ast.Call) and index.local_target(stmt.value) is None


def _loop_element(index: Index, name: ast.Name, at: ast.AST) -> ast.AST | None:
    """For a loop variable, what it is taken from: `for v in xs` -> xs, `for k, v in d.items()` -> d (its values)."""
    for loop in index.loops_around(at):
        node = loop.node
        if not isinstance(node, ast.For):
            continue
        if isinstance(node.target, ast.Name) and node.target.id == name.id:
            return node.iter
        if isinstance(node.target, ast.Tuple) and len(node.target.elts) == 2 \
                and isinstance(node.target.elts[1], ast.Name) and node.target.elts[1].id == name.id \
                and isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Attribute) \
                and node.iter.func.attr == "items":
            return node.iter.func.value
    return None


def _own_backward_names(index: Index, fn: ast.AST) -> set[str]:
    """`backward_names` of one function, cached on the index: the graph walk asks it for every call it follows."""
    cache = index.__dict__.setdefault("_backward_names_by_function", {})
    if fn not in cache:
        cache[fn] = backward_names(index, fn)
    return cache[fn]


def backward_names(index: Index, scope: ast.AST | None = None) -> set[str]:
    """Names that appear in what `.backward()` is called on (or passed to `accelerator.backward`)."""
    names: set[str] = set()
    for call in index.backward_calls:
        if scope is not None and index.function_of(call) is not scope:
            continue
        parts: list[ast.AST] = list(call.args)
        if isinstance(call.func, ast.Attribute):
            parts.append(call.func.value)
        for part in parts:
            for node in subtree(part):
                if isinstance(node, ast.Name):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute):
                    d = dotted(node)
                    if d:
                        names.add(d)
    return names


# -- softmax / attention -------------------------------------------------------------------------


# Tensor methods that keep softmax output probabilities: a new shape, layout, dtype or device.
_RESHAPES = frozenset({"view", "reshape", "resize", "squeeze", "unsqueeze", "flatten", "permute", "transpose",
                       "contiguous", "float", "double", "half", "to", "type_as", "cpu", "cuda"})


def _self_attr_is(index: Index, func: ast.AST, qualified: frozenset[str] | set[str]) -> bool:
    """`self.softmax(...)` where `self.softmax = nn.Softmax(...)` in the class."""
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"):
        return False
    info = index.class_of(func)
    if info is None:
        return False
    for assign in index.self_assignments(info, None):
        if assign.attr == func.attr and isinstance(assign.value, ast.Call):
            if index.resolve(assign.value.func) in qualified:
                return True
    return False


def is_softmax_call(index: Index, expr: ast.AST) -> ast.AST | None:
    """The input of a softmax call (`F.softmax(x)`, `x.softmax(-1)`, `nn.Softmax(1)(x)`, `self.softmax(x)`)."""
    if not isinstance(expr, ast.Call):
        return None
    func = expr.func
    q = index.resolve(func)
    if q in SOFTMAX:
        return kwarg(expr, "input", 0)
    if isinstance(func, ast.Attribute) and func.attr == "softmax" and q is None:
        return func.value
    if isinstance(func, ast.Call) and index.resolve(func.func) == "torch.nn.Softmax":
        return expr.args[0] if expr.args else None
    if _self_attr_is(index, func, {"torch.nn.Softmax"}):
        return expr.args[0] if expr.args else None
    return None


def softmax_kind(index: Index, expr: ast.AST) -> str | None:
    """'softmax' or 'log_softmax' when `expr` is a call of one: the function (`F.log_softmax(x, 1)`), the tensor
    method (`x.log_softmax(-1)`), a layer built in place (`nn.LogSoftmax(1)(x)`), a layer kept on `self`
    (`self.softmax(x)`), or a layer bound to a local name (`m = nn.LogSoftmax(); pred = m(pred)`)."""
    if not isinstance(expr, ast.Call):
        return None
    func = expr.func
    q = index.resolve(func)
    if _exp_of_log_softmax(index, expr, q):
        return "softmax"  # `torch.exp(F.log_softmax(x, 1))`: probabilities, written the long way
    for kind, functions in _KIND_FUNCTIONS.items():
        if q in functions:
            return kind
        if isinstance(func, ast.Attribute) and func.attr == kind and q is None \
                and not (isinstance(func.value, ast.Name) and func.value.id == "self"):
            return kind  # `x.softmax(-1)`; `self.softmax(x)` is a layer the class keeps, told by what it holds below
    for kind, layer in _KIND_LAYERS.items():
        if isinstance(func, ast.Call) and index.resolve(func.func) == layer:
            return kind
        if _self_attr_is(index, func, {layer}):
            return kind
        if isinstance(func, ast.Name):
            b = index.binding(func)
            if b is not None and b.cls == layer:
                return kind
    return None


def _exp_of_log_softmax(index: Index, expr: ast.Call, q: str | None) -> bool:
    """`torch.exp(F.log_softmax(x, 1))`, `x.log_softmax(-1).exp()`, or the exponential of a name assigned a
    log_softmax just before: the model hands out probabilities, however they were computed."""
    if q == "torch.exp" and expr.args:
        inner = expr.args[0]
    elif isinstance(expr.func, ast.Attribute) and expr.func.attr == "exp" and q is None and not expr.args:
        inner = expr.func.value
    else:
        return False
    if isinstance(inner, ast.Name):
        inner = latest_value(index, inner.id, inner)
    return inner is not None and softmax_kind(index, inner) == "log_softmax"


def is_probabilities(index: Index, expr: ast.AST | None, at: ast.AST, depth: int = 0) -> bool:
    """Whether `expr` holds softmax output: a softmax call, a name assigned one, or a model whose forward
    ends in a softmax (an `nn.Sequential(..., nn.Softmax())` or a class returning `softmax(...)`)."""
    return probabilities_origin(index, expr, at, depth) is not None


def probabilities_origin(index: Index, expr: ast.AST | None, at: ast.AST, depth: int = 0,
                         position: int | None = None, kinds: frozenset[str] = PROBABILITIES) -> ast.AST | None:
    """The softmax that made `expr` (a softmax call, or the `nn.Softmax()` layer of a model), or None.
    `position` picks an element of a tuple the expression returns (`validity, label = D(x)`); `kinds` says which
    last steps count (`LOG_PROBABILITIES` asks for a log_softmax instead)."""
    if expr is None or depth > DEPTH:
        return None
    if position is None and softmax_kind(index, expr) in kinds:
        return expr
    if isinstance(expr, ast.Tuple) and position is not None:
        return probabilities_origin(index, expr.elts[position], at, depth + 1, None, kinds) \
            if position < len(expr.elts) else None
    if isinstance(expr, ast.Name):
        unpacked = _unpacked_from(index, expr.id, expr)
        if unpacked is not None:
            value, where = unpacked
            return probabilities_origin(index, value, value, depth + 1, where, kinds)
        value = latest_value(index, expr.id, expr)
        if value is None:
            # `for out in outputs:` with `outputs = torch.softmax(scores, -1)`: each slice is probabilities too
            for loop in index.loops_around(at):
                node = loop.node
                if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and node.target.id == expr.id:
                    return probabilities_origin(index, node.iter, node, depth + 1, None, kinds)
            return None
        return probabilities_origin(index, value, value, depth + 1, position, kinds)
    if isinstance(expr, ast.Subscript) and position is None and isinstance(expr.slice, ast.Constant) \
            and isinstance(expr.slice.value, str):
        return _keyed_output(index, expr, depth, kinds)
    if isinstance(expr, ast.Call):
        func = expr.func
        if position is None and isinstance(func, ast.Attribute) and func.attr in _RESHAPES \
                and index.resolve(func) is None:
            # `y_pred.view(1, -1)`, `probs.float()`: a reshaped or cast softmax output is still probabilities
            return probabilities_origin(index, func.value, at, depth + 1, None, kinds)
        found = model_softmax(index, func, position, depth, kinds)
        if found is None and position is None and index.is_submodule(expr.func):
            # `self.cd4(x, nn.Sequential(self.fc4, self.softmax))`: a wrapper layer (concrete dropout, a
            # checkpointing or residual wrapper) that applies the layer it is handed returns that layer's output.
            found = next((o for a in expr.args[1:] if (o := softmax_layer(index, a, kinds)) is not None), None)
        return found
    return None


def _keyed_output(index: Index, expr: ast.Subscript, depth: int, kinds: frozenset[str]) -> ast.AST | None:
    """`criterion(output["out"], y)` with `output = net(x)`: the softmax a module class of this file puts under that
    key of the dict its forward returns (`out["out"] = softmax(...)`, or `return {"out": softmax(...)}`)."""
    key = expr.slice.value  # type: ignore[attr-defined]
    base = expr.value
    if isinstance(base, ast.Name):
        base = latest_value(index, base.id, base)
    if not isinstance(base, ast.Call) or depth > DEPTH:
        return None
    b = index.binding(base.func)
    info = index.classes.get(b.cls or "") if b is not None and b.kind == "module" else None
    forward = info.method("forward") if info is not None and info.is_module else None
    if forward is None:
        return None
    origins = []
    for r in (n.value for n in subtree(forward) if isinstance(n, ast.Return) and n.value is not None):
        value = None
        if isinstance(r, ast.Dict):
            value = next((v for k, v in zip(r.keys, r.values, strict=True)
                          if isinstance(k, ast.Constant) and k.value == key), None)
        elif isinstance(r, ast.Name):
            for node in subtree(forward):
                if isinstance(node, ast.Assign) and node.lineno < r.lineno and any(
                        isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == r.id
                        and isinstance(t.slice, ast.Constant) and t.slice.value == key for t in node.targets):
                    value = node.value  # the last assignment of that key before the return
        origins.append(probabilities_origin(index, value, value, depth + 1, None, kinds) if value is not None else None)
    return origins[0] if origins and all(o is not None for o in origins) else None


def softmax_layer(index: Index, expr: ast.AST | None, kinds: frozenset[str] = PROBABILITIES) -> ast.AST | None:
    """The softmax layer a layer expression ends in: `nn.Softmax(1)`, `self.softmax` (assigned one), or an
    `nn.Sequential(...)` whose last element is one (`nn.LogSoftmax` when `kinds` asks for log-probabilities)."""
    layers = {_KIND_LAYERS[k] for k in kinds}
    if isinstance(expr, ast.Call) and index.resolve(expr.func) in layers:
        return expr
    if isinstance(expr, ast.Attribute) and _self_attr_is(index, expr, layers):
        return expr
    if isinstance(expr, ast.Call) and index.resolve(expr.func) == "torch.nn.Sequential" and expr.args:
        # `nn.Sequential(*layers)`: the last layer the list holds (layerstack.py)
        last = last_layer(index, expr)
        return softmax_layer(index, last, kinds) if last is not None and last is not expr else None
    return None


def _unpacked_from(index: Index, name: str, at: ast.AST) -> tuple[ast.expr, int] | None:
    """`validity, label = discriminator(x)`: (the call, the name's position) for the latest such assignment
    of `name` before `at` in its scope."""
    scope = index.scope_of(at)
    here = (getattr(at, "lineno", 1 << 30), getattr(at, "col_offset", 0))
    found = None
    for stmt, _ in index.defs(scope).get(name, []):
        if (stmt.lineno, stmt.col_offset) >= here or not isinstance(stmt, ast.Assign):
            continue
        target = stmt.targets[0]
        if isinstance(target, ast.Tuple) and not isinstance(stmt.value, ast.Tuple):
            names = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
            found = (stmt.value, names.index(name)) if name in names else None
        else:
            found = None
    return found


def unpacked_from(index: Index, name: str, at: ast.AST) -> tuple[ast.expr, int] | None:
    """`probs, classes = model(x)`: the call and the position `name` takes in the tuple it returns."""
    return _unpacked_from(index, name, at)


def model_returns_softmax(index: Index, func: ast.AST) -> bool:
    return model_softmax(index, func, None, 0) is not None


def model_softmax(index: Index, func: ast.AST, position: int | None, depth: int,
                  kinds: frozenset[str] = PROBABILITIES) -> ast.AST | None:
    """The softmax at the end of a model's forward (or of one element of the tuple it returns); `self(x)` in a
    module's own method (a LightningModule's training_step) runs that module's forward."""
    if isinstance(func, ast.Name) and func.id == "self":
        own = index.class_of(func)
        return _forward_softmax(index, own, position, depth, kinds) if own is not None and own.is_module else None
    b = index.binding(func)
    if (b is None or b.call is None or index.resolve(b.call.func) is None and not isinstance(
            b.call.func, ast.Name | ast.Attribute)) and isinstance(func, ast.Name) and depth <= DEPTH:
        # `model = ARCHS[args.arch]()`, `model = (Deep if args.deep else Linear)()`: a class of this file chosen at
        # run time; any candidate whose forward ends in a softmax may be the one that runs
        for info in _chosen_classes(index, func):
            found = _forward_softmax(index, info, position, depth, kinds)
            if found is not None:
                return found
        return None
    if b is None or b.kind != "module" or b.call is None or depth > DEPTH:
        return None
    call, cls = b.call, b.cls
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        # a binding is the file's latest of that spelling: `self.net` of another class of the file is not this
        # class's `self.net`, whose own assignment says what it holds
        own = index.class_of(func)
        if own is not None and index.class_of(b.node) is not own:
            mine = [a.value for a in index.self_assignments(own, None)
                    if a.attr == func.attr and isinstance(a.value, ast.Call)]
            if not mine:
                return None
            call = mine[-1]
            cls = index.resolve(call.func) or dotted(call.func)
    if cls == "torch.nn.Sequential" and position is None:
        # the last layer of the stack, also when code builds it: `nn.Sequential(*layers)` of a list filled by a
        # loop, or an empty one grown by `add_module` (layerstack.py)
        last = last_layer(index, call, b.name)
        layers = {_KIND_LAYERS[k] for k in kinds}
        return last if isinstance(last, ast.Call) and index.resolve(last.func) in layers else None
    info = index.classes.get(cls or "")
    if info is None or not info.is_module:
        return None
    return _forward_softmax(index, info, position, depth, kinds)


def _chosen_classes(index: Index, name: ast.Name) -> list:
    """The module classes of this file a name's constructor call picks among: a table of classes called by key
    (`{"mlp": MLP, "deep": Deep}[arch]()`, the table bound to a name here or at module level) or a conditional
    expression of classes (`(Deep if deep else MLP)()`)."""
    values = index.definitions(name.id, name)
    value = values[-1] if values else None
    if not isinstance(value, ast.Call):
        return []
    picked = value.func
    options: list[ast.AST] = []
    if isinstance(picked, ast.Subscript):
        table = picked.value
        if isinstance(table, ast.Name):
            table = latest_value(index, table.id, table) or next(
                (v for _s, v in reversed(index.defs(index.tree).get(table.id, []))), None)
        if isinstance(table, ast.Dict):
            options = [v for v in table.values if v is not None]
        elif isinstance(table, ast.List | ast.Tuple):
            options = list(table.elts)
    elif isinstance(picked, ast.IfExp):
        options = [picked.body, picked.orelse]
    found = []
    for option in options:
        info = index.classes.get(dotted(option) or "") if isinstance(option, ast.Name) else None
        if info is not None and info.is_module:
            found.append(info)
    return found


def _forward_softmax(index: Index, info, position: int | None, depth: int,
                     kinds: frozenset[str] = PROBABILITIES) -> ast.AST | None:
    """The softmax every `return` of a module class's forward ends in, or None."""
    forward = info.method("forward")
    if forward is None:
        return None
    returns = [n.value for n in subtree(forward) if isinstance(n, ast.Return) and n.value is not None]
    origins = [probabilities_origin(index, r, r, depth + 1, position, kinds) for r in returns]
    return origins[0] if origins and all(o is not None for o in origins) else None


def is_scores(index: Index, expr: ast.AST | None, at: ast.AST, depth: int = 0) -> bool:
    """Attention scores: a matrix product (`q @ k.transpose(-2, -1)`, `torch.matmul`, `einsum`),
    possibly scaled, biased or masked."""
    if expr is None or depth > DEPTH:
        return False
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.MatMult):
            return True
        return is_scores(index, expr.left, at, depth + 1) or is_scores(index, expr.right, at, depth + 1)
    if isinstance(expr, ast.Call):
        q = index.resolve(expr.func)
        if q in MATMUL:
            return True
        if q == "torch.where":
            return any(is_scores(index, a, at, depth + 1) for a in expr.args[1:])
        if isinstance(expr.func, ast.Attribute) and expr.func.attr in (
            "masked_fill",
            "masked_fill_",
            "float",
            "to",
            "type_as",
            "contiguous",
            "add",
            "mul",
            "div",
        ):
            return is_scores(index, expr.func.value, at, depth + 1)
        return False
    if isinstance(expr, ast.Name):
        value = latest_value(index, expr.id, expr)
        return value is not None and is_scores(index, value, value, depth + 1)
    return False


def attention_probs(index: Index, expr: ast.AST | None, at: ast.AST, depth: int = 0) -> bool:
    """softmax(scores), possibly through dropout or a dtype cast."""
    if expr is None or depth > DEPTH:
        return False
    inner = is_softmax_call(index, expr)
    if inner is not None:
        return is_scores(index, inner, at, depth + 1)
    if isinstance(expr, ast.Call):
        func = expr.func
        q = index.resolve(func)
        is_dropout = (
            q in DROPOUT
            or _self_attr_is(index, func, {"torch.nn.Dropout"})
            or (isinstance(func, ast.Attribute) and "drop" in func.attr.lower() and q is None)
        )
        if is_dropout and expr.args:
            return attention_probs(index, expr.args[0], at, depth + 1)
        if isinstance(func, ast.Attribute) and func.attr in ("to", "type_as", "float", "half", "contiguous"):
            return attention_probs(index, func.value, at, depth + 1)
        return False
    if isinstance(expr, ast.Name):
        value = latest_value(index, expr.id, expr)
        return value is not None and attention_probs(index, value, value, depth + 1)
    return False


# -- tensors -------------------------------------------------------------------------------------


def tensor_factory(index: Index, expr: ast.AST | None) -> ast.Call | None:
    """The torch factory call a tensor expression starts from (`torch.ones(n).tril().bool()` -> ones)."""
    for _ in range(DEPTH):
        if not isinstance(expr, ast.Call):
            return None
        q = index.resolve(expr.func)
        if q in TENSOR_FACTORIES:
            return expr
        if isinstance(expr.func, ast.Attribute):
            expr = expr.func.value
        else:
            return None
    return None


def requires_grad_in_chain(expr: ast.AST | None) -> bool:
    """`torch.randn(3, requires_grad=True)` or `torch.zeros(3).requires_grad_()` anywhere in a call chain."""
    for _ in range(DEPTH):
        if not isinstance(expr, ast.Call):
            return False
        for kw in expr.keywords:
            if kw.arg == "requires_grad" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                return True
        if isinstance(expr.func, ast.Attribute):
            if expr.func.attr == "requires_grad_":
                arg = kwarg(expr, "requires_grad", 0)
                return not (isinstance(arg, ast.Constant) and arg.value is False)
            expr = expr.func.value
        else:
            return False
    return False


# -- values that can reach 0 exactly -----------------------------------------------------------

SQUASHING = frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit", *SOFTMAX})
# Classification losses: -log of a probability, exactly 0 once that probability rounds to 1 (a logit margin above
# about 17 in float32), which a confident model reaches on easy samples.
CROSS_ENTROPY = frozenset({
    "torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss", "torch.nn.functional.binary_cross_entropy",
    "torch.nn.functional.binary_cross_entropy_with_logits", "torch.nn.CrossEntropyLoss", "torch.nn.NLLLoss",
    "torch.nn.BCELoss", "torch.nn.BCEWithLogitsLoss",
})
# Calls that keep a value away from 0 (a floor, a clamp) or compute the log safely themselves.
_FLOORS = frozenset({"clamp", "clip", "clamp_min", "clamp_", "clip_", "clamp_min_", "maximum", "max", "fmax"})
# Calls that keep the value as it is for this question (shape, dtype, reductions of a probability tensor).
_SAME_VALUE = frozenset({"squeeze", "unsqueeze", "view", "reshape", "flatten", "float", "double", "contiguous",
                         "to", "gather", "index_select", "masked_select", "permute", "transpose", "type_as"})


def zero_reachable(index: Index, expr: ast.AST | None, at: ast.AST, depth: int = 0, *,
                   seen: bool = False) -> str | None:
    """Why `expr` can be exactly 0, as a short phrase, or None when nothing says so (or a clamp or an
    epsilon keeps it away from 0). A value in [0, 1] reaches 0 in float32: a sigmoid or softmax output
    underflows (a logit below about -104) and its complement `1 - p` is 0 once p rounds to 1 (a logit
    above about 17). So: a sigmoid/softmax output, `1 - p`, and `torch.where(c, p, 1 - p)` (the focal-loss
    p_t), followed through the function's own assignments. With `seen`, the complement counts only when its `p`
    is itself a sigmoid/softmax output here: `1 - pred` of a parameter says nothing about what the caller passed
    (CenterNet's focal loss receives a prediction already clamped away from 0 and 1)."""
    if expr is None or depth > DEPTH:
        return None
    if isinstance(expr, ast.Name):
        value = latest_value(index, expr.id, expr)
        return zero_reachable(index, value, value, depth + 1, seen=seen) if value is not None else None
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
        value = latest_self_value(index, expr, at)  # ASL's optimized loss keeps `self.xs_pos = torch.sigmoid(x)`
        return zero_reachable(index, value, value, depth + 1, seen=seen) if value is not None else None
    if isinstance(expr, ast.Subscript):
        return zero_reachable(index, expr.value, at, depth + 1, seen=seen)
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.Sub) and isinstance(expr.left, ast.Constant) and expr.left.value == 1 \
                and not _floored(index, expr.right, depth):
            if seen and zero_reachable(index, expr.right, at, depth + 1, seen=True) is None:
                return None
            return "a complement `1 - p`, which is 0 once p rounds to 1"
        if isinstance(expr.op, ast.Mult | ast.Pow):
            return zero_reachable(index, expr.left, at, depth + 1, seen=seen)
        return None  # `p + eps`, `p - q`, `p / n`: not asked further
    if not isinstance(expr, ast.Call):
        return None
    func = expr.func
    q = index.resolve(func)
    if q in SQUASHING or isinstance(func, ast.Attribute) and q is None and func.attr in ("sigmoid", "softmax"):
        return "a sigmoid/softmax output, which underflows to 0 (and rounds to 1)"
    if q in CROSS_ENTROPY or (b := index.binding(func)) is not None and b.kind == "loss" and b.cls in CROSS_ENTROPY:
        return "a cross-entropy value, which is exactly 0 once the model is confident on the batch"
    if q == "torch.where" and len(expr.args) == 3:
        for branch in expr.args[1:]:
            found = zero_reachable(index, branch, at, depth + 1, seen=seen)
            if found is not None:
                return found
        return None
    if isinstance(func, ast.Attribute) and q is None and func.attr in _SAME_VALUE:
        return zero_reachable(index, func.value, at, depth + 1, seen=seen)
    return None


def latest_self_value(index: Index, attr: ast.Attribute, at: ast.AST) -> ast.expr | None:
    """The value last assigned to `self.<attr>` in the same function before `at` (`self.xs_pos =
    torch.sigmoid(x)` a few lines above the log), or None: none there, or an in-place change since that may
    move it (`self.xs_neg.add_(clip).clamp_(max=1)`) or one we cannot read."""
    fn = index.function_of(at)
    if fn is None:
        return None
    name, line = dotted(attr), getattr(at, "lineno", 0)
    value: ast.expr | None = None
    assigned = 0
    for node in subtree(fn):
        if isinstance(node, ast.Assign) and node.lineno < line and node.lineno >= assigned and any(
                dotted(t) == name for t in node.targets):
            value, assigned = node.value, node.lineno
    if value is None:
        return None
    for node in subtree(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_") \
                and assigned < node.lineno <= line and _receiver_is(node.func.value, name):
            return None  # changed in place after the assignment (add_, clamp_, mul_): not followed
    return value


def _receiver_is(expr: ast.AST, name: str | None) -> bool:
    """`self.x` in `self.x.add_(c).clamp_(max=1)`: the chain's innermost receiver."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        expr = expr.func.value
    return dotted(expr) == name


def _floored(index: Index, expr: ast.AST, depth: int) -> bool:
    """`p.clamp(eps, 1 - eps)`, `torch.clamp(p, ...)`, `p - eps`: kept away from the bounds, also through the
    function's own assignments (`pred = pred.clamp(1e-4, 1 - 1e-4)` a line above)."""
    for _ in range(DEPTH):
        if isinstance(expr, ast.Name):
            value = latest_value(index, expr.id, expr)
            if value is None:
                return False
            expr = value
            continue
        if isinstance(expr, ast.BinOp):
            return True  # `p - eps`, `p * (1 - 2 * eps) + eps`: arithmetic that moves it off the bounds
        if isinstance(expr, ast.Call):
            func = expr.func
            name = func.attr if isinstance(func, ast.Attribute) else (index.resolve(func) or dotted(func) or "").rsplit(".", 1)[-1]
            if name in _FLOORS or "clip" in name.lower() or "clamp" in name.lower():
                return True  # also the project's own clamp (yolov4-pytorch's `self.clip_by_tensor(pred, eps, 1 - eps)`)
            if isinstance(func, ast.Attribute) and func.attr in _SAME_VALUE:
                expr = func.value
                continue
        return False
    return False

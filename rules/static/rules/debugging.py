"""TD6xx — debugging: train/eval mode mistakes, anomaly detection left on, numerically unstable
log(softmax) and BCE-on-sigmoid. Docs: debugging.toml."""

from __future__ import annotations

import ast

from torchdoctor.rules.static.api import Context, project, rule
from torchdoctor.rules.static.callcontext import defer, leave_sites, settle
from torchdoctor.rules.static.index import ClassInfo, Index, Loop, dotted, is_constant, is_eval_word, kwarg
from torchdoctor.rules.static.patterns import (
    is_loss_callable,
    is_probabilities,
    is_softmax_call,
    latest_value,
    zero_reachable,
)
from torchdoctor.rules.static.project import Project, ProjectHit
from torchdoctor.rules.static.rules.profiling import snippet
from torchdoctor.rules.static.semantic import lossuse, practice
from torchdoctor.rules.static.semantic.callsites import outermost_uncalled
from torchdoctor.rules.static.semantic.subtree import subtree

# Layers whose forward depends on train()/eval(): dropout and batch norm (Transformer layers carry dropout).
_MODE_LAYERS = frozenset(
    f"torch.nn.{n}"
    for n in (
        "Dropout Dropout1d Dropout2d Dropout3d AlphaDropout FeatureAlphaDropout "
        "BatchNorm1d BatchNorm2d BatchNorm3d LazyBatchNorm1d LazyBatchNorm2d LazyBatchNorm3d SyncBatchNorm "
        "Transformer TransformerEncoderLayer TransformerDecoderLayer TransformerEncoder TransformerDecoder"
    ).split()
)
_FUNCTIONAL_DROPOUT = frozenset(
    {
        "torch.nn.functional.dropout",
        "torch.nn.functional.dropout1d",
        "torch.nn.functional.dropout2d",
        "torch.nn.functional.dropout3d",
        "torch.nn.functional.alpha_dropout",
        "torch.nn.functional.feature_alpha_dropout",
    }
)
_ANOMALY_SET = frozenset({"torch.autograd.set_detect_anomaly", "torch.autograd.anomaly_mode.set_detect_anomaly"})
_ANOMALY_CONTEXT = frozenset({"torch.autograd.detect_anomaly", "torch.autograd.anomaly_mode.detect_anomaly"})
_SIGMOID = frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"})
_SHAPE_METHODS = frozenset({"squeeze", "unsqueeze", "view", "reshape", "flatten", "float", "double", "contiguous", "to"})


# -- does a model change behaviour between train() and eval()? ---------------------------------


def _dropout_p_zero(call: ast.Call) -> bool:
    return is_constant(kwarg(call, "p", 0), 0.0) or is_constant(kwarg(call, "p", 0), 0)


def _expr_has_mode_layers(index: Index, expr: ast.AST, seen: set[str]) -> bool:
    for node in subtree(expr):
        if not isinstance(node, ast.Call):
            continue
        q = index.resolve(node.func)
        if q in _MODE_LAYERS:
            if not ("Dropout" in q and _dropout_p_zero(node)):
                return True
        elif q in _FUNCTIONAL_DROPOUT:
            if any(kw.arg == "training" for kw in node.keywords):
                return True
        elif q is None:
            local = dotted(node.func)
            info = index.classes.get(local or "")
            if info is not None and info.is_module and _class_has_mode_layers(index, info, seen):
                return True
    return False


def _class_has_mode_layers(index: Index, info: ClassInfo, seen: set[str]) -> bool:
    if info.name in seen:
        return False
    seen.add(info.name)
    if _expr_has_mode_layers(index, info.node, seen):
        return True
    for base in info.bases:
        local = index.classes.get(base)
        if local is not None and _class_has_mode_layers(index, local, seen):
            return True
    return False


def _layers_from_outside(index: Index, info: ClassInfo) -> bool:
    """The class keeps modules it is handed (`def __init__(self, encoders, fusion, head): self.head = head`,
    `self.encoders = nn.ModuleList(encoders)`): what layers it holds is decided by its callers."""
    return bool(_handed_attributes(index, info))


def _handed_attributes(index: Index, info: ClassInfo) -> set[str]:
    """The attributes `__init__` sets to something it was handed: `self.head = head`,
    `self.encoders = nn.ModuleList(encoders)`."""
    init = info.method("__init__")
    if init is None:
        return set()
    params = {a.arg for a in init.args.posonlyargs + init.args.args + init.args.kwonlyargs} - {"self"}
    handed = set()
    for assign in index.self_assignments(info, "__init__"):
        value = assign.value
        if isinstance(value, ast.Call) and index.resolve(value.func) in ("torch.nn.ModuleList", "torch.nn.Sequential",
                                                                       "torch.nn.ModuleDict") and value.args:
            value = value.args[0]
        if isinstance(value, ast.Name) and value.id in params:
            handed.add(assign.attr)
    return handed


def model_has_mode_layers(index: Index, expr: ast.AST | None, depth: int = 0) -> bool:
    """Whether a model holds dropout or batch-norm layers (so train()/eval() changes its output).
    False when unsure."""
    return model_mode_layers(index, expr, depth) is True


def model_mode_layers(index: Index, expr: ast.AST | None, depth: int = 0) -> bool | None:
    """True/False when the model's layers can be read (its class in the file, a known architecture, a Sequential
    of known layers), None when they cannot (`self.model = model_class.from_config(...)`, a parameter)."""
    if expr is None or depth > 4:
        return None
    if isinstance(expr, ast.Name) and expr.id == "self":
        info = index.class_of(expr)
        return bool(info and info.is_module and _class_has_mode_layers(index, info, set()))
    name = dotted(expr)
    if name is not None and name.endswith((".module", "._orig_mod")):
        return model_mode_layers(index, expr.value, depth + 1)  # type: ignore[attr-defined]
    bindings = [b for b in index.bindings.get(name or "", []) if b.kind == "module"] if name else []
    if not bindings:
        return None
    # Every binding of the name counts (`model = Net()` ... `model = DataParallel(model)`), and a copy
    # (`model = self.model`) answers for what it copies.
    answers = [_binding_mode_layers(index, b, depth) for b in bindings]
    if True in answers:
        return True
    return False if False in answers else None


def _binding_mode_layers(index: Index, b, depth: int) -> bool | None:
    if b.inner is not None and b.inner != b.name:
        inner = index.binding(b.inner)
        if inner is not None and inner is not b:
            answer = model_mode_layers(index, ast.Name(b.inner), depth + 1)
            if answer is not None:
                return answer
    value = getattr(b.node, "value", None)
    if b.call is None and isinstance(value, ast.Name | ast.Attribute) and dotted(value) != b.name:
        return model_mode_layers(index, value, depth + 1)
    cls = b.cls or ""
    info = index.classes.get(cls)
    if info is not None:
        if not info.is_module:
            return False
        if _class_has_mode_layers(index, info, set()):
            return True
        return None if _layers_from_outside(index, info) else False
    if cls in _MODE_LAYERS:
        return True
    if index.project is not None and cls and index.project.has_mode_layers(cls):
        return True  # `TextClassifier()` imported from models.py, whose body builds an `nn.Dropout` (the pre-pass)
    if cls in ("torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict"):
        # a container built here is read; one handed in by another file (its kind from the callers, no call in
        # this file) holds layers we cannot see
        return _expr_has_mode_layers(index, b.call, set()) if b.call is not None else None
    if any(cls.startswith(p) for p in index.names["model_factory_prefixes"]):
        return True  # torchvision / timm architectures carry batch norm or dropout
    if cls.endswith("from_pretrained") or any(m in cls.rsplit(".", 1)[-1] for m in index.names["pretrained_model_markers"]):
        return True
    if not cls or b.wrapper is not None and b.inner == b.name:
        return None  # a class we cannot see, or a wrapper around an earlier binding of the same name
    return False if cls.startswith("torch.nn.") else None


# -- train()/eval() calls --------------------------------------------------------------------


def _mode_of(index: Index, call: ast.Call) -> str | None:
    """"eval" / "train" / "unknown" for `m.eval()`, `m.train()`, `m.train(False)`, `m.train(flag)`."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in ("eval", "train"):
        return None
    receiver = mode_receiver(call)
    # `Generator(4).eval()`, `AutoModel.from_pretrained(p).eval()`: the switch is chained on the call that builds
    # the model, before it is bound to a name, so the name's kind cannot vouch for it yet; a no-argument
    # `.eval()`/`.train()` on a fresh call result is a module's (SRGAN's test scripts, mdlm's perplexity model)
    built = isinstance(receiver, ast.Call)
    b = None if built else index.binding(receiver)
    if b is not None and b.kind != "module":
        return None
    if not built and not index.is_model(receiver):
        return None
    if func.attr == "eval":
        return "eval" if not call.args and not call.keywords else None
    mode = kwarg(call, "mode", 0)
    if mode is None or is_constant(mode, True):
        return "train"
    if is_constant(mode, False):
        return "eval"
    return "unknown"


def mode_receiver(call: ast.Call) -> ast.expr:
    """The model of a mode switch, through same-object calls: `transformer` in
    `transformer.to(device).train()` (pytorch/examples' fast_neural_style, after a CPU checkpoint save)."""
    expr = call.func.value  # type: ignore[attr-defined]
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in (
            "to", "cuda", "cpu", "float", "half", "double"):
        expr = expr.func.value
    return expr


def _model_key(expr: ast.AST) -> str | None:
    name = dotted(expr)
    if name is None:
        return None
    for suffix in (".module", "._orig_mod"):
        while name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.rsplit(".", 1)[-1]


def _calls_by_function(ctx: Context, fn: ast.AST | None) -> list[ast.Call]:
    """The calls made in a function's own body, in source order: the index's table (`calls_in`), which the loops
    already build, not a second one grouped the same way."""
    return ctx.index.calls_in(fn)


def _local_target(index: Index, call: ast.Call) -> ast.AST | None:
    """The function of this file a call runs: a module-level function, a sibling closure, a `self.` method."""
    return index.local_target(call)


def _eval_before(ctx: Context, anchor: ast.AST, depth: int = 0) -> bool:
    """Whether the last train/eval switch that runs before `anchor` is `.eval()` (in its function,
    or, when the function itself switches nothing, before every call of it in the file)."""
    index = ctx.index
    fn = index.function_of(anchor)
    position = (anchor.lineno, anchor.col_offset)  # type: ignore[attr-defined]
    last = None
    for call in _calls_by_function(ctx, fn):
        if (call.lineno, call.col_offset) >= position:
            break
        mode = _mode_of(index, call)
        if mode is None:
            target = _local_target(index, call)  # set_eval(model), self.prepare_eval()
            if target is not None and target is not fn:
                modes = [m for m in map(lambda c: _mode_of(index, c), _calls_by_function(ctx, target)) if m]
                mode = modes[-1] if modes else None
        if mode is not None:
            last = mode
    if last is not None:
        return last != "train"  # eval, or a mode we cannot read: not flagged
    if fn is None or depth >= 3:
        return False
    callers = index.callers(fn)
    return bool(callers) and all(_eval_before(ctx, c, depth + 1) for c in callers)


def _train_set_before(ctx: Context, anchor: ast.AST, depth: int = 0) -> ast.Call | None:
    """The `model.train()` that is the last mode switch before `anchor` in its function: the evaluation runs in
    training mode because the code said so (`def eval_one_epoch(model, loader): model.train(); ...`). When the
    function switches nothing, the same question for the places that call it (up to 3 calls up), when all of them
    agree: `train()` calls `model.train()`, then `validate(ctx)`, which calls `predict(model, loader)` (TrOCR), or a
    solver's `train` calls `task_model.train()` and then `self.test(task_model)` (VAAL)."""
    index = ctx.index
    fn = index.function_of(anchor)
    position = (anchor.lineno, anchor.col_offset)  # type: ignore[attr-defined]
    last: tuple[str, ast.Call] | None = None
    for call in _calls_by_function(ctx, fn):
        if (call.lineno, call.col_offset) >= position:
            break
        mode = _mode_of(index, call)
        if mode is not None:
            last = (mode, call)
    if last is not None:
        return last[1] if last[0] == "train" else None
    if fn is None or depth >= 3:
        return None
    callers = index.callers(fn)
    found = [_train_set_before(ctx, c, depth + 1) for c in callers]
    return found[0] if found and all(f is not None for f in found) else None


@rule("TD601", ast.Module)
def validation_in_train_mode(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    seen: set[int] = set()
    for loop in index.validation_loops():
        call = next((c for c in loop.all_calls() if _model_run(index, c) is not None), None)
        if call is None or id(call) in seen:
            continue  # nested validation loops (splits, then batches) run the model at one call: one finding
        seen.add(id(call))
        model = _model_run(index, call)
        layers = model_mode_layers(index, model)
        explicit = _train_set_before(ctx, call)
        trained = _trained_never_switched(ctx, model) if layers is None and explicit is None else None
        if trained is not None:  # giotto-deep's Pipeline: `_train_loop` trains self.model, `_val_loop` runs it
            if not _eval_before(ctx, call) and not _own_models_mode_free(index):
                _report_or_defer(ctx, call, variable=dotted(model) or "model", loader=loop.source or
                                 "the validation data", cause=f"this file trains it (line {trained.lineno}) and never "
                                 "calls `.eval()` on any model, so it is still in training mode")
            continue
        if layers is None and explicit is None:
            _leave_param_run(ctx, loop, call, model)  # a caller in another file may have put it in training mode
            _leave_kept_run(ctx, loop, call, model)  # ... or handed it to this object's constructor
        if layers is False or layers is None and explicit is None:
            continue  # no dropout/batch norm, or a model we cannot read that nobody put in train mode on purpose
        if _eval_before(ctx, call):
            continue
        variable = dotted(model) or "model"
        if layers is None and explicit is not None and index.function_of(explicit) is index.function_of(call):
            trainer = _training_loop_between(index, explicit, call)
            if trainer is not None:
                # `model.train()` is right for the training loop it opens (deepspeech.pytorch's epoch loop): the
                # validation loop after that training loop is what lacks its `.eval()`, so it is the line to change
                ctx.report(call, variable=variable, loader=loop.source or "the validation data",
                           cause=f"`{ctx.segment(explicit, 40)}` (line {explicit.lineno}) puts it in training mode for "
                                 f"the training loop at line {trainer.line}, and nothing calls `.eval()` after it")
                continue
            # the evidence is the `model.train()` before it in the same function: the line to change
            ctx.report(explicit, variable=variable, loader=loop.source or "the validation data",
                       cause=f"`{ctx.segment(explicit, 40)}` switches it to training mode before the forward")
            continue
        if layers is None and explicit is not None:  # put in training mode by a caller, and never switched back
            caller = index.function_of(explicit)
            where = f" in `{caller.name}`" if isinstance(caller, ast.FunctionDef | ast.AsyncFunctionDef) else ""
            ctx.report(call, variable=variable, loader=loop.source or "the validation data",
                       cause=f"`{ctx.segment(explicit, 40)}` (line {explicit.lineno}{where}) leaves it in training "
                             "mode, and nothing calls `.eval()` on the way to this validation loop")
            continue
        _report_or_defer(ctx, call, variable=variable, loader=loop.source or "the validation data",
                         cause="nothing calls `.eval()` before this validation loop")
    leave_sites(ctx)
    _test_batches_in_training(ctx)
    _phase_loops(ctx)
    _phase_step_functions(ctx)
    _leave_modes_at_calls(ctx)
    practice.leave_evaluations(ctx)
    practice.note_covered(ctx, "TD601")


def _leave_param_run(ctx: Context, loop: Loop, call: ast.Call, model: ast.expr) -> None:
    """For the project pass: a module-level function that runs a model parameter over a validation loop with no
    mode switch on the way and no caller in this file (GACNet's `utils.test_seg(model, loader, ...)`). Whether it
    runs in training mode is up to the files that call it."""
    index = ctx.index
    fn = index.function_of(call)
    if not isinstance(model, ast.Name) or fn is None or index.functions.get(fn.name) is not fn or index.callers(fn):
        return
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if model.id not in params or _eval_before(ctx, call):
        return
    ctx.leave("TD601-param-run", {"function": fn.name, "position": params.index(model.id), "line": call.lineno,
                                  "col": call.col_offset + 1, "variable": model.id,
                                  "loader": loop.source or "the validation data"})


def _kept_parameter(index: Index, info, attr: str) -> int | None:
    """The position (after `self`) of the constructor parameter that `self.<attr> = <param>` keeps, if any."""
    init = info.method("__init__")
    if init is None:
        return None
    params = [a.arg for a in init.args.posonlyargs + init.args.args][1:]
    for assign in index.self_assignments(info, "__init__"):
        if assign.attr == attr and isinstance(assign.value, ast.Name) and assign.value.id in params:
            return params.index(assign.value.id)
    return None


def _leave_kept_run(ctx: Context, loop: Loop, call: ast.Call, model: ast.expr) -> None:
    """For the project pass: a method that runs `self.model` over a validation loop with no mode switch on the
    way, where `self.model` is what the constructor was handed (`Evaluator(model, val_loader).run()`). The mode
    it runs in is the one the file that built the object left the model in when it calls the method."""
    index = ctx.index
    name = dotted(model) or ""
    if not name.startswith("self.") or name.count(".") != 1:
        return
    info = index.class_of(call)
    fn = index.function_of(call)
    if info is None or fn is None or info.method(fn.name) is not fn or _eval_before(ctx, call):
        return
    position = _kept_parameter(index, info, name[5:])
    if position is None:
        return
    ctx.leave("TD601-kept-run", {"class": info.name, "method": fn.name, "position": position, "line": call.lineno,
                                 "col": call.col_offset + 1, "variable": name,
                                 "loader": loop.source or "the validation data"})


def _leave_kept_mode_calls(ctx: Context, switches: bool) -> None:
    """For the project pass: `evaluator.run()` on an object built here from a class of another module that was
    handed a model (`evaluator = Evaluator(model, val_loader)`), with the mode this file left the model in just
    before the method call."""
    index = ctx.index
    # the names bound to such an object first (a few statements), so the calls are searched only when there are some
    holders = {t.id for stmt in index.nodes(ast.Assign) if isinstance(stmt.value, ast.Call)  # type: ignore[attr-defined]
               and _external_model_call(index, stmt.value)  # type: ignore[attr-defined]
               for t in stmt.targets if isinstance(t, ast.Name)}  # type: ignore[attr-defined]
    if not holders:
        return
    for call in index.nodes(ast.Call):
        func = call.func
        if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name) or func.value.id not in holders:
            continue
        built = latest_value(index, func.value.id, call)
        if not isinstance(built, ast.Call) or index.local_target(built) is not None:
            continue
        models = _external_model_call(index, built)
        if not models:
            continue
        explicit = _train_set_before(ctx, call) if switches else None
        mode = "train" if explicit is not None else "eval" if switches and _eval_before(ctx, call) else None
        ctx.leave("mode-at-method-call", {"class": index.resolve(built.func), "method": func.attr,
                                          "models": {str(i): k for i, k in models.items()}, "mode": mode,
                                          "switch": explicit.lineno if explicit is not None else None,
                                          "shown": ctx.segment(explicit, 40) if explicit is not None else "",
                                          "line": call.lineno})


@project("TD601")
def validation_in_train_mode_of_kept_models(project: Project) -> list[ProjectHit]:
    """main.py builds `Evaluator(model, val_loader)`, then calls `model.train()` and trains, then `evaluator.run()`;
    evaluator.py's `run` runs `self.model` over its loader with no `.eval()`: it runs in training mode. Reported when
    every such method call seen in the project comes after the caller left the model in training mode."""
    runs = {(f.module, fact["class"], fact["method"]): (f, fact) for f, fact in project.facts("TD601-kept-run")}
    if not runs:
        return []
    calls: dict[tuple[str, str, str], list[tuple[object, dict]]] = {}
    for g, fact in project.facts("mode-at-method-call"):
        for owner, name in project.defining(fact["class"] or ""):
            key = (owner.module, name, fact["method"])
            if key in runs and str(runs[key][1]["position"]) in fact["models"]:
                calls.setdefault(key, []).append((g, fact))
    hits = []
    for key, found in calls.items():
        if not all(fact["mode"] == "train" for _g, fact in found):
            continue
        f, run = runs[key]
        g, first = found[0]
        hits.append(ProjectHit(f.path, run["line"], run["col"], {
            "variable": run["variable"], "loader": run["loader"],
            "cause": f"`{first['shown']}` (line {first['switch']} of {g.path}) leaves the model it handed to "  # type: ignore[attr-defined]
                     f"`{key[1]}` in training mode before `{run['method']}()` runs it, and nothing calls `.eval()` "
                     "on the way to this loop"}))
    return hits


def _leave_modes_at_calls(ctx: Context) -> None:
    """For the project pass: calls handing a model to a function of another module of the project, and the mode
    the code left that model in just before (`model.train()` in the training loop, then `test_seg(model, ...)`).
    A file that trains and never switches modes tells its calls too, with no mode: whether the model is still in
    training mode there depends on whether any file of the project switches it (ethos-ares's run_training.py
    trains and calls `estimate_loss(model, ...)` from metrics.py, and no file calls `.eval()`)."""
    index = ctx.index
    switches = bool(index.method_calls("train") or index.method_calls("eval"))
    if any(_mode_of(index, c) not in (None, "train") for c in index.method_calls("eval") + index.method_calls("train")):
        ctx.leave("switches-out-of-training", True)
    # (a file without a module class searches no text; then the text test: most files name no dropout or batch norm
    # layer, and the class walk is not free)
    if any(info.is_module for info in index.classes.values()) \
            and any(w in index.source for w in ("Dropout", "dropout", "BatchNorm", "Norm(")) and any(
            info.is_module and _class_has_mode_layers(index, info, set()) for info in index.classes.values()):
        ctx.leave("mode-layers", True)
    trains = any(lp.has_backward or lp.has_step for lp in index.training_loops())
    if not switches and not trains:
        return  # neither a mode switch nor training in this file: nothing to tell about a model's mode at a call
    _leave_kept_mode_calls(ctx, switches)
    for call in index.nodes(ast.Call):
        if index.local_target(call) is not None:
            continue
        models = _external_model_call(index, call)
        if not models:
            continue
        explicit = _train_set_before(ctx, call) if switches else None
        mode = "train" if explicit is not None else "eval" if switches and _eval_before(ctx, call) else None
        ctx.leave("mode-at-call", {"callee": index.resolve(call.func), "models": {str(i): k for i, k in models.items()},
                                   "mode": mode, "switch": explicit.lineno if explicit is not None else None,
                                   "shown": ctx.segment(explicit, 40) if explicit is not None else "",
                                   "line": call.lineno, "trains": trains})


@project("TD601")
def validation_in_train_mode_across_files(project: Project) -> list[ProjectHit]:
    """train_semseg.py calls `model.train()` in its training loop and then `test_seg(model, ...)` from utils.py,
    which runs the model over the test loader with no `.eval()`: it runs in training mode. Reported when every call
    of the function seen in the project hands it a model the caller left in training mode."""
    runs = {(f.module, fact["function"]): (f, fact) for f, fact in project.facts("TD601-param-run")}
    if not runs:
        return []
    calls: dict[tuple[str, str], list[tuple[object, dict]]] = {}
    for g, fact in project.facts("mode-at-call"):
        for owner, name in project.defining(fact["callee"] or ""):
            key = (owner.module, name)
            if key in runs and str(runs[key][1]["position"]) in fact["models"]:
                calls.setdefault(key, []).append((g, fact))
    # No file switches any model out of training mode, and the project defines models with dropout or batch norm:
    # a model the callers train is still in training mode when they hand it over.
    never_switched = not project.any_fact("switches-out-of-training") and project.any_fact("mode-layers")
    hits = []
    for key, found in calls.items():
        if not all(fact["mode"] == "train" for _g, fact in found):
            if never_switched and all(fact["mode"] in ("train", None) for _g, fact in found):
                training = [(g, fact) for g, fact in found if fact.get("trains")]
                if training:
                    f, run = runs[key]
                    g, first = training[0]
                    hits.append(ProjectHit(f.path, run["line"], run["col"], {
                        "variable": run["variable"], "loader": run["loader"],
                        "cause": f"{g.path} trains it and calls `{run['function']}()` (line {first.get('line')}), and "  # type: ignore[attr-defined]
                                 "no file of the project ever calls `.eval()`, so it is still in training mode"}))
            continue
        f, run = runs[key]
        g, first = found[0]
        hits.append(ProjectHit(f.path, run["line"], run["col"], {
            "variable": run["variable"], "loader": run["loader"],
            "cause": f"`{first['shown']}` (line {first['switch']} of {g.path}) leaves it in training mode before "  # type: ignore[attr-defined]
                     f"the call of `{run['function']}()`, and nothing calls `.eval()` on the way to this loop"}))
    return hits


def _report_or_defer(ctx: Context, call: ast.Call, **values: str) -> None:
    """Report, unless the validation runs in a function no call of this file runs (`def validate(model, loader)`
    in engine.py): then every call of it in the project decides, and one after `model.eval()` everywhere settles it."""
    here = ctx.index.function_of(call)
    if here is not None and "eval" in ctx.index.framework_context(here):
        return  # Lightning's on_validation_epoch_end: the evaluation loop put the model in eval mode
    fn = outermost_uncalled(ctx.index, call)
    if fn is None:
        ctx.report(call, **values)
    else:
        defer(ctx, call, fn, "eval", values, key="TD601-deferred")


@project("TD601")
def validation_settled_by_its_callers(project: Project) -> list[ProjectHit]:
    """A validation function that every call in the project runs after `.eval()` runs in eval mode."""
    return settle(project, "TD601-deferred")


def _training_loop_between(index: Index, switch: ast.Call, call: ast.Call) -> Loop | None:
    """A training loop of the same function that starts after the `.train()` switch and ends before the validation
    forward: the switch served that loop."""
    fn = index.function_of(call)
    start = (switch.lineno, switch.col_offset)
    end = (call.lineno, call.col_offset)
    for loop in index.training_loops():
        node = loop.node
        if loop.scope is not fn and index.function_of(node) is not fn:
            continue
        if not (loop.has_backward or loop.has_step or loop.calls_training):
            continue
        last = getattr(node, "end_lineno", None) or node.lineno
        if start < (node.lineno, node.col_offset) and (last, 1 << 30) < end:
            return loop
    return None


def _own_models_mode_free(index: Index) -> bool:
    """The file defines the models it trains and none holds dropout or batch norm (torchbeast's IMPALA `Net`, run
    by its actors under no_grad): training and evaluation mode compute the same thing, so the mode never matters."""
    models = [info for info in index.classes.values() if info.is_module]
    return bool(models) and not any(
        _class_has_mode_layers(index, info, set()) or _calls_handed_modules(index, info) for info in models)


def _calls_handed_modules(index: Index, info: ClassInfo) -> bool:
    """The class calls something its constructor was handed (`self.head = head` ... `self.head(x)`): layers its
    callers choose. A handed number (`self.num_actions = num_actions`) is not a layer."""
    handed = _handed_attributes(index, info)
    return bool(handed) and any(
        isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "self" and call.func.attr in handed
        for call in ast.walk(info.node) if isinstance(call, ast.Call))


def _trained_never_switched(ctx: Context, model: ast.expr) -> ast.Call | None:
    """The call that runs `model` in a training loop of this file, when nothing in the file ever switches any
    model out of training mode (no `.eval()`, no `.train(False)` or `.train(flag)`; a plain `.train()` before the
    training loop is fine): the model is in training mode (what every module starts in, and what `.train()` asks
    for) when the validation loop runs it. dnnbrain's `dnn_train_model` calls `model.train()` and its
    `dnn_test_model(dataloaders, model)` runs the model with no `.eval()` anywhere. None otherwise."""
    index = ctx.index
    key = dotted(model)
    if key is None or not index.handed_in(model):
        return None
    if ctx.memo("debugging:any-switch-out-of-training", lambda: any(
            _mode_of(index, c) not in (None, "train") for c in index.method_calls("eval") + index.method_calls("train"))):
        return None
    for loop in index.training_loops():
        if not (loop.has_backward or loop.has_step):
            continue
        for c in loop.calls:
            found = _model_run(index, c)
            if found is not None and dotted(found) == key:
                return c
    return None


def _phase_loops(ctx: Context) -> None:
    """`for phase in ('train', 'val'):` around one batch loop that steps only under `if phase == 'train':`
    (ZOO_Attack_PyTorch's `fit`): the 'val' pass runs the same forward, and with no `.eval()` that runs for that
    phase it runs in training mode: no switch at all, or only `if phase == 'train': model.train()`, whose
    training mode the evaluation pass inherits (phases.py decides which switch runs for which value). A function
    the file calls for both phases (`step('train', ...)`, `step('val', ...)`) is read the same way when it
    switches the mode only for training; with no switch at all its caller decides, and the checks above ask it."""
    index = ctx.index
    steps = set(index.backward_calls) | set(index.step_calls)
    candidates = []
    for outer in index.loops.values():
        phase = index.loop_phase(outer)
        if phase is not None and phase.scope is outer.node and _phase_variable(outer.node) is not None:
            candidates.append((phase, outer.all_calls(), outer.children))
    for fn in {index.function_of(lp.node) for lp in index.loops.values() if lp.has_backward or lp.has_step}:
        phase = index.parameter_phase(fn) if fn is not None else None
        if phase is not None:
            own = [lp for lp in index.loops.values() if index.function_of(lp.node) is fn
                   and (lp.parent is None or index.function_of(lp.parent.node) is not fn)]
            candidates.append((phase, index.calls_in(fn), own))
    for phase, scope_calls, loops in candidates:
        training = [v for v in phase.values if v not in phase.evaluation]
        for inner in loops:
            mine = [c for c in inner.all_calls() if c in steps]
            if not mine or any(index.runs_in_phase(c, phase, v) for c in mine for v in phase.evaluation):
                continue
            if not any(index.runs_in_phase(c, phase, v) for c in mine for v in training):
                continue
            for value in phase.evaluation:
                call = next((c for c in inner.all_calls() if _model_run(index, c) is not None
                             and index.runs_in_phase(c, phase, value)), None)
                if call is None or model_mode_layers(index, _model_run(index, call)) is False:
                    continue
                model = _model_run(index, call)
                left = _mode_left_for(index, scope_calls, phase, value, model, call)
                if left is None or phase.origins and (not isinstance(left, ast.Call)
                                                      or index.runs_in_phase(left, phase, value)):
                    continue  # a step function with no switch, or one switching for every phase: checks above
                loader = inner.source or ctx.segment(getattr(inner.node, "iter", inner.node), 40)
                if phase.origins:
                    where = f"`{phase.name} = {value!r}` (the call at line {phase.origins[0].lineno})"
                else:
                    where = f"`{phase.name}` in `{ctx.segment(phase.scope.iter, 40)}`"  # type: ignore[attr-defined]
                if isinstance(left, ast.Call):
                    cause = (f"with {where} this forward runs for {value!r} too but the step runs only in training, "
                             f"and `{ctx.segment(left, 40)}` (line {left.lineno}) runs only for the training "
                             f"phase, whose training mode {value!r} inherits")
                else:
                    cause = (f"the loop over {where} runs this forward in every phase but steps only in training, "
                             "and nothing calls `.eval()` for the evaluation phase")
                ctx.report(call, variable=dotted(model) or "model", loader=loader or "the validation data", cause=cause)
                break


def _mode_left_for(index: Index, scope_calls: list[ast.Call], phase, value, model: ast.expr,
                   forward: ast.Call) -> ast.Call | bool | None:
    """The training mode the pass where the phase holds `value` runs `forward` in: True when the phase's code
    switches no mode at all, the `.train()` of the training pass when only that one runs; None when an `.eval()`
    runs for `value`, or a switch cannot be followed (another model, a mode the phase does not decide)."""
    key = _model_key(model)
    switches = [c for c in scope_calls if _mode_of(index, c) is not None
                and (c.lineno, c.col_offset) < (forward.lineno, forward.col_offset)]
    if not switches:
        return True
    if any(_model_key(mode_receiver(c)) != key for c in switches):
        return None
    running = [c for c in switches if index.runs_in_phase(c, phase, value)]
    if running:
        modes = [index.mode_in_phase(c, phase, value) for c in running]
        if None in modes or modes[-1] != "train":
            return None
        return running[-1]
    training = [v for v in phase.values if v not in phase.evaluation]
    for v in training:
        modes = [(c, index.mode_in_phase(c, phase, v)) for c in switches if index.runs_in_phase(c, phase, v)]
        if not modes or any(m is None for _, m in modes) or modes[-1][1] != "train":
            return None
    return next(c for c in reversed(switches) if index.runs_in_phase(c, phase, training[0]))


_PHASE_PARAMETERS = frozenset({"phase", "mode", "split", "stage"})


def _phase_step_functions(ctx: Context) -> None:
    """A step function shared by the phases (stacked hourglass's `make_train(batch_id, config, phase, **inputs)`,
    which train.py calls for 'train' and 'valid'): it switches the model to training mode for every phase and runs
    the forward for every phase, but backpropagates and steps only under a test of `phase`, so the other phases run
    in training mode. Reported at the switch, the line to key on the phase."""
    index = ctx.index
    steps = set(index.backward_calls) | set(index.step_calls)
    if not steps or not index.method_calls("train"):
        return
    for c in index.method_calls("train"):
        fn = index.function_of(c)
        if fn is None or c.args or c.keywords:
            continue
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]  # type: ignore[attr-defined]
        phase = next((p for p in params if p in _PHASE_PARAMETERS or p.endswith("_phase")), None)
        if phase is None or _phase_test_above(index, c, phase, fn):
            continue
        mine = [s for s in steps if index.function_of(s) is fn]
        if not mine or not all(_phase_test_above(index, s, phase, fn) for s in mine):
            continue
        key = dotted(mode_receiver(c))
        evals = [e.lineno for e in index.method_calls("eval") if index.function_of(e) is fn
                 and dotted(mode_receiver(e)) == key]
        # the tests that keep the steps to training (`if phase == 'train':`): a forward outside them runs in every
        # phase they leave out (under `if phase != 'inference':` too)
        gates = {id(_phase_test_above(index, st, phase, fn, innermost=True)) for st in mine}
        runs = [r for r in index.calls_in(fn) if key is not None and dotted(r.func) == key and r.lineno > c.lineno
                and not any(id(a) in gates for a in index.ancestors(r))
                and not any(c.lineno < e < r.lineno for e in evals)]  # an `.eval()` on the way settles that run
        if not runs or model_mode_layers(index, mode_receiver(c)) is False:
            continue
        ctx.report(c, variable=key, loader=f"the batches of every `{phase}`",
                   cause=f"`{ctx.segment(c, 40)}` runs for every `{phase}` while the backward and the step run only "
                         f"under a test of `{phase}`, so the other phases run the forward in training mode")


def _phase_test_above(index: Index, node: ast.AST, phase: str, fn: ast.AST, innermost: bool = False):
    """Under an `if` (or conditional expression) of the function that reads the phase; with `innermost`, that
    nearest `if` node (or None) instead of True/False."""
    for anc in index.ancestors(node):
        if anc is fn:
            break
        if isinstance(anc, ast.If | ast.IfExp) and any(isinstance(n, ast.Name) and n.id == phase
                                                        for n in ast.walk(anc.test)):
            return anc if innermost else True
    return None if innermost else False


def _phase_variable(node: ast.AST) -> str | None:
    """`phase` in `for phase in ('train', 'val'):` (a literal list of names, one of them evaluation data)."""
    if not isinstance(node, ast.For) or not isinstance(node.target, ast.Name):
        return None
    if not isinstance(node.iter, ast.Tuple | ast.List) or len(node.iter.elts) < 2:
        return None
    words = [e.value for e in node.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if len(words) != len(node.iter.elts) or not any(is_eval_word(w) for w in words):
        return None
    return node.target.id


def _under_phase_test(index: Index, node: ast.AST, phase: str, loop) -> bool:
    for anc in index.ancestors(node):
        if anc is loop.node:
            return False
        if isinstance(anc, ast.If) and any(isinstance(n, ast.Name) and n.id == phase for n in ast.walk(anc.test)):
            return True
    return False


def _test_batches_in_training(ctx: Context) -> None:
    """A training loop that scores a batch drawn from evaluation data every few steps (pointnet.pytorch's
    `j, data = next(enumerate(testdataloader, 0))` then `classifier(points)` under `if i % 10 == 0:`): the model is
    in training mode there, since this very loop trains it, unless an `.eval()` runs between the draw and the
    forward."""
    index = ctx.index
    for loop in index.training_loops():
        if not (loop.has_backward or loop.has_step):
            continue
        draws = [c for c in loop.calls if isinstance(c.func, ast.Name) and c.func.id == "next" and c.args
                 and _eval_source(c.args[0])]
        for draw in draws:
            stmt = index.statement_of(draw)
            if not isinstance(stmt, ast.Assign):
                continue
            names = {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            for call in loop.calls:
                if (call.lineno, call.col_offset) <= (stmt.lineno, stmt.col_offset):
                    continue
                if _mode_of(index, call) is not None and (call.lineno, call.col_offset) > (stmt.lineno, 0):
                    break  # a mode switch after the draw: the forward below runs in that mode
                model = _model_run(index, call)
                if model is None or not any(_derived_from(index, a, names, stmt, call) for a in
                                            [*call.args, *(k.value for k in call.keywords)]):
                    continue
                if model_mode_layers(index, model) is False:
                    break
                source = dotted(_eval_source(draw.args[0])) or "the evaluation data"
                ctx.report(call, variable=dotted(model) or "model", loader=source,
                           cause="this loop trains it, and nothing calls `.eval()` between drawing the "
                                 f"`{source}` batch and this forward")
                break


def _eval_source(expr: ast.AST) -> ast.expr | None:
    """The evaluation loader inside `iter(test_loader)`, `enumerate(testdataloader, 0)`, `val_loader` itself."""
    for _ in range(3):
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("iter", "enumerate") \
                and expr.args:
            expr = expr.args[0]
            continue
        break
    if isinstance(expr, ast.Name | ast.Attribute) and is_eval_word(dotted(expr)):
        return expr
    return None


def _derived_from(index: Index, expr: ast.AST, names: set[str], after: ast.stmt, at: ast.AST) -> bool:
    """Whether `expr` is built from `names` (bound at `after`), directly or through the assignments between
    `after` and `at` in the same block (`points, target = data`, `points = points.transpose(2, 1)`)."""
    seen = set(names)
    changed = True
    while changed:
        changed = False
        for stmt in ast.walk(index.function_of(at) or _module_of(index, at)):
            if isinstance(stmt, ast.Assign) and after.lineno < stmt.lineno < at.lineno and any(  # type: ignore[attr-defined]
                    isinstance(n, ast.Name) and n.id in seen for n in ast.walk(stmt.value)):
                new = {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)} - seen
                if new:
                    seen |= new
                    changed = True
    return any(isinstance(n, ast.Name) and n.id in seen for n in ast.walk(expr))


def _module_of(index: Index, node: ast.AST) -> ast.AST:
    """The module a node sits in: the scope of top-level script code."""
    root = node
    for anc in index.ancestors(node):
        root = anc
    return root


def _model_run(index: Index, call: ast.Call) -> ast.expr | None:
    """The model a call runs: `model(x)`, `model.generate(x)`."""
    if isinstance(call.func, ast.Name | ast.Attribute) and index.is_model(call.func):
        return call.func
    return index.model_run_method(call)


# A train/eval switch or a training step, in execution order: (kind, call, model keys).
Event = tuple[str, ast.Call, frozenset[str]]


def _trained_models(index: Index, ctx: Context, step: ast.Call) -> frozenset[str]:
    """Models run next to a backward/optimizer step: called, or passed to a function, in its loop
    (or its function when the step is not in a loop)."""
    loop = index.loop_of(step)
    # Outside a loop, the models the step trains ran before it: a model run after it in the same function (the
    # reconstructions muse-maskgit samples every N steps) is what the step's function evaluates, not what it trains.
    calls = loop.calls if loop is not None else [c for c in _calls_by_function(ctx, index.function_of(step))
                                                 if (c.lineno, c.col_offset) < (step.lineno, step.col_offset)]
    # `optimizer.step()`, or `scaler.step(optimizer)`; a bare `scaler.step()` names no optimizer (None: unknown)
    optimizers = [c.func.value if index.kind_of(c.func.value) == "optimizer" else kwarg(c, "optimizer", 0)  # type: ignore[attr-defined]
                  for c in calls if index.is_optimizer_step(c)]
    if optimizers and all(o is not None and _tensors_only(index, o) for o in optimizers):
        return frozenset()  # the step trains an input, a patch or an image (`SGD([patch])`): no model at all
    keys: set[str] = set()
    for c in calls:
        if index.grad_disabled(c):
            continue  # a frozen reference or teacher run under no_grad is not what the step trains
        if isinstance(c.func, ast.Name | ast.Attribute) and index.is_model(c.func):
            key = _model_key(c.func)
            if key and not (isinstance(c.func, ast.Attribute) and c.func.attr in ("eval", "train", "zero_grad")):
                keys.add(key)
        for a in c.args:
            if isinstance(a, ast.Name | ast.Attribute) and index.is_model(a):
                key = _model_key(a)
                if key:
                    keys.add(key)
    return frozenset(keys)


def _tensors_only(index: Index, optimizer: ast.AST) -> bool:
    """An optimizer built over a literal list of names that are no module's parameters (`SGD([patch])`,
    `LBFGS([input_img])`): an adversarial patch, a style-transfer image, a prompt on a frozen model."""
    b = index.binding(optimizer)
    params = b.arg("params", 0) if b is not None and b.kind == "optimizer" else None
    if not isinstance(params, ast.List | ast.Tuple) or not params.elts:
        return False
    return all(isinstance(e, ast.Name) and not index.is_model(e) for e in params.elts)


def _events(ctx: Context, calls: list[ast.Call], depth: int, stack: tuple[ast.AST, ...]) -> list[Event] | None:
    index = ctx.index
    steps = ctx.memo("debugging:steps", lambda: set(index.backward_calls) | set(index.step_calls))
    out: list[Event] = []
    for call in calls:
        mode = _mode_of(index, call)
        if mode == "unknown" or mode is not None and _mode_from_flag(index, call, mode):
            return None  # `model.train(flag)`, or `if flag: model.train() else: model.eval()`: we cannot follow it
        if mode is not None:
            key = _model_key(mode_receiver(call))
            if key and not (mode == "eval" and _leaves_loop(index, call, depth)):
                out.append((mode, call, frozenset({key})))
            continue
        if call in steps:
            out.append(("step", call, _trained_models(index, ctx, call)))
            continue
        target = _local_target(index, call)
        external = _external_model_call(index, call) if target is None and depth == 0 else None
        if external is not None:
            out.append(("call", call, frozenset(external.values())))
            continue
        if target is not None and depth < 3 and target not in stack:
            dead = _ruled_out(index, target, call)
            inner_calls = [c for c in _calls_by_function(ctx, target) if c not in dead]
            inner = _events(ctx, inner_calls, depth + 1, (*stack, target))
            if inner is None:
                return None
            if depth == 0:  # the loop's own call through which an `.eval()` deep inside takes effect
                anchors = ctx.memo("debugging:eval-anchors", dict)
                for kind, inner_call, _ in inner:
                    if kind == "eval":
                        anchors.setdefault(inner_call, call)
            out.extend(inner)
    return out


def _mode_from_flag(index: Index, call: ast.Call, mode: str) -> bool:
    """`if train: model.train() else: model.eval()`: the branch that runs depends on a flag, as in
    `model.train(train)` (a step function shared by training and validation, r9y9/wavenet_vocoder). The same
    switch written as one expression, `model.train() if phase == 'train' else model.eval()`, counts too."""
    holder = index.parent(call)
    if isinstance(holder, ast.IfExp) and call is not holder.test:
        other_call = holder.orelse if call is holder.body else holder.body
        if isinstance(other_call, ast.Call):
            theirs = _mode_of(index, other_call)
            if theirs is not None and theirs != mode and \
                    _model_key(other_call.func.value) == _model_key(call.func.value):  # type: ignore[attr-defined]
                return True
    stmt = index.statement_of(call)
    parent = index.parent(stmt) if stmt is not None else None
    if not isinstance(parent, ast.If) or not parent.orelse:
        return False
    other = parent.orelse if stmt in parent.body else parent.body
    key = _model_key(call.func.value)  # type: ignore[attr-defined]
    for s in other:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            theirs = _mode_of(index, s.value)
            if theirs is not None and theirs != mode and _model_key(s.value.func.value) == key:  # type: ignore[attr-defined]
                return True
    return False


def _ruled_out(index: Index, target: ast.AST, call: ast.Call) -> set[ast.Call]:
    """Calls of `target` that cannot run for this call: under `if train:` when it passes `train=False` (demucs's
    `self._run_one_epoch(epoch, train=False)` for validation), or under `if not train:` when it passes True."""
    if not isinstance(target, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    params = [a.arg for a in target.args.args]
    offset = 1 if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute) else 0
    known: dict[str, bool] = {}
    positional = target.args.posonlyargs + target.args.args  # a flag left at its default (`train=True`) is known too
    for a, default in zip(positional[len(positional) - len(target.args.defaults):], target.args.defaults, strict=True):
        if isinstance(default, ast.Constant) and isinstance(default.value, bool):
            known[a.arg] = default.value
    for a, default in zip(target.args.kwonlyargs, target.args.kw_defaults, strict=True):
        if isinstance(default, ast.Constant) and isinstance(default.value, bool):
            known[a.arg] = default.value
    if any(isinstance(a, ast.Starred) for a in call.args) or any(kw.arg is None for kw in call.keywords):
        return set()  # `f(*args)` / `f(**kw)`: which flags it passes is unknown
    for i, arg in enumerate(call.args):
        if i + offset < len(params):
            if isinstance(arg, ast.Constant) and isinstance(arg.value, bool):
                known[params[i + offset]] = arg.value
            else:
                known.pop(params[i + offset], None)  # passed, but not a constant we can read
    for kw in call.keywords:
        if kw.arg and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool):
            known[kw.arg] = kw.value.value
        elif kw.arg:
            known.pop(kw.arg, None)
    if not known:
        return set()

    return {inner for inner in index.calls_in(target)
            if any(known.get(p, v) is not v for p, v in _flag_needs(index, inner, target, set(known)).items())}


def _flag_needs(index: Index, call: ast.AST, fn: ast.AST, flags: set[str]) -> dict[str, bool]:
    """What the `if`s around `call` inside `fn` require of the boolean flags `flags`: `if train:` -> True,
    `if not train and ...:` -> False, the `else` of `if train:` -> False. The nearest `if` wins."""
    out: dict[str, bool] = {}
    child: ast.AST = call
    for anc in index.ancestors(call):
        if anc is fn:
            break
        if isinstance(anc, ast.If):
            inside = any(child is s for s in anc.body)
            tests = anc.test.values if inside and isinstance(anc.test, ast.BoolOp) and \
                isinstance(anc.test.op, ast.And) else [anc.test]
            for test in tests:
                negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
                name = test.operand if negated else test  # type: ignore[attr-defined]
                if isinstance(name, ast.Name) and name.id in flags:
                    out.setdefault(name.id, inside != negated)
        child = anc
    return out


@rule("TD602", ast.Module)
def train_mode_not_restored(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    _leave_param_evals(ctx)
    _leave_constructor_evals(ctx)
    reported: set[ast.Call] = set()
    for loop in index.training_loops():
        # Which call of this loop an `.eval()` deep inside runs through: per loop (an epoch loop reaches the same
        # `.eval()` through its own call as the batch loop inside it does through another).
        ctx.memo("debugging:eval-anchors", dict).clear()
        calls = sorted(loop.all_calls(), key=lambda c: (c.lineno, c.col_offset))
        calls = _with_the_steps(index, loop, calls)
        events = _events(ctx, calls, 0, (index.function_of(loop.node),) if index.function_of(loop.node) else ())
        if events and any(kind == "call" for kind, _, _ in events):
            _leave_loop(ctx, loop, events)
        if not events or not any(kind == "eval" for kind, _, _ in events):
            continue
        # The first stale `.eval()` that matters: several models may be left in eval mode, and one that holds no
        # dropout or batch norm must not hide another that does.
        found = next((c for c in _stale_evals(events) if c not in reported and not _frozen_mode_training(index, c)
                      and model_mode_layers(index, c.func.value) is not False  # type: ignore[attr-defined]
                      and not _frozen_with_the_switch(index, c)), None)
        if found is None:
            continue
        reported.add(found)
        where = f"the loop over `{loop.source}`" if loop.source else f"the training loop at line {loop.line}"
        # Reached through a call in the loop (`self.validate()` every N steps): the loop's line is where the mode
        # goes stale, and where `.train()` belongs; the `.eval()` itself is named in the message.
        anchor = ctx.memo("debugging:eval-anchors", dict).get(found)
        at = anchor if anchor is not None and index.loop_of(anchor) is not None else found
        via = f" (set at line {found.lineno}, inside `{ctx.segment(at.func, 40)}()`)" if at is not found else ""
        # A file with backward passes but no optimizer anywhere (Torch-Pruning's importance benchmark: gradients
        # scored for pruning on a model built in eval mode) may train nothing: whether a later step trains in eval
        # mode is decided where the parameters are updated, which this file does not show. Info.
        weak = not index.step_calls and not index.training_step_calls() and not index.bindings_of("optimizer")
        ctx.report(at, severity="info" if weak else None, variable=dotted(found.func.value) or "model",  # type: ignore[attr-defined]
                   loop=where, via=via, train_not_restored=True)


def _with_the_steps(index: Index, loop, calls: list[ast.Call]) -> list[ast.Call]:
    """The loop's calls that can run in the same pass as its training steps. A loop shared by training and
    validation (demucs's `_run_one_epoch(epoch, train=True|False)`) steps under `if train:` and evaluates
    under `if not train:`: a `train` parameter the function never reassigns makes the two exclusive in one
    call, so the evaluation never leaves eval mode on for a step of the same pass (the caller's loop, which
    calls it twice, is judged on its own)."""
    fn = index.function_of(loop.node)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return calls
    params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    params -= {n.id for n in subtree(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    if not params:
        return calls

    steps = set(index.backward_calls) | set(index.step_calls)
    step_needs = [_flag_needs(index, c, fn, params) for c in calls if c in steps]
    if not step_needs:
        return calls

    def exclusive(call: ast.Call) -> bool:
        mine = _flag_needs(index, call, fn, params)
        return bool(mine) and all(any(other.get(p) is (not v) for p, v in mine.items()) for other in step_needs)

    return [c for c in calls if c in steps or not exclusive(c)]


def _frozen_with_the_switch(index: Index, call: ast.Call) -> bool:
    """`text_encoder.train(False); text_encoder.requires_grad_(False)` (kohya's sd-scripts, when text-encoder
    training stops at a given step): the model leaves training for good, so eval mode is what is meant."""
    key = dotted(mode_receiver(call))
    fn = index.function_of(call)
    return any(dotted(c.func.value) == key and is_constant(kwarg(c, "requires_grad", 0), False)  # type: ignore[attr-defined]
               and index.function_of(c) is fn for c in index.method_calls("requires_grad_"))


def _frozen_mode_training(index: Index, call: ast.Call) -> bool:
    """`def train(...): model.eval(); for x, y in loader: ... optimizer.step()`: the training function itself puts
    the model in eval mode before its own loop (a linear probe on frozen features, frozen batch norm). That is a
    choice, not an evaluation left behind."""
    fn = index.function_of(call)
    return fn is not None and fn in index.training_functions and index.training_loop_of(call) is None \
        and any(lp.trains and lp.node.lineno > call.lineno for lp in index.training_loops()
                if index.function_of(lp.node) is fn)


def _leave_param_evals(ctx: Context) -> None:
    """For the project pass: module-level functions that leave a model parameter in eval mode
    (`def eval_net(net, loader): net.eval() ...` with no `net.train()` after it)."""
    index = ctx.index
    switches = sorted(index.method_calls("eval") + index.method_calls("train"), key=lambda c: (c.lineno, c.col_offset))
    if not switches:
        return
    module_level = {id(fn): name for name, fn in index.functions.items()}
    last: dict[tuple[int, str], ast.Call] = {}
    params_of: dict[int, list[str]] = {}
    for call in switches:  # only the mode switches, in source order: the last one per parameter wins
        fn = index.function_of(call)
        if fn is None or id(fn) not in module_level or not isinstance(call.func.value, ast.Name):  # type: ignore[attr-defined]
            continue
        params = params_of.setdefault(id(fn), [a.arg for a in fn.args.posonlyargs + fn.args.args])
        if call.func.value.id in params:  # type: ignore[attr-defined]
            last[(id(fn), call.func.value.id)] = call  # type: ignore[attr-defined]
    for (fn_id, param), call in last.items():
        if call.func.attr == "eval" and not call.args and not call.keywords:  # type: ignore[attr-defined]
            ctx.leave("evals-param", {"function": module_level[fn_id], "position": params_of[fn_id].index(param),
                                      "line": call.lineno})


def _leave_constructor_evals(ctx: Context) -> None:
    """For the project pass: classes whose methods switch a model their constructor was handed to eval mode and
    leave it there (hedwig's `BertEvaluator(model, ...)`: `get_scores()` runs `self.model.eval()`), by method."""
    index = ctx.index
    if not index.method_calls("eval"):
        return
    for info in index.classes.values():
        if info.is_module or info.method("__init__") is None:
            continue
        for name, method in info.methods.items():
            if name == "__init__":
                continue
            last: dict[str, ast.Call] = {}
            for call in sorted((c for c in index.calls_in(method) if _mode_of(index, c) in ("eval", "train")),
                               key=lambda c: (c.lineno, c.col_offset)):
                receiver = mode_receiver(call)
                if isinstance(receiver, ast.Attribute) and isinstance(receiver.value, ast.Name) \
                        and receiver.value.id == "self":
                    last[receiver.attr] = call
            for attr, call in last.items():
                position = index.constructor_parameter(info, attr)
                if _mode_of(index, call) == "eval" and position is not None:
                    ctx.leave("evals-constructor-param", {"class": info.name, "method": name, "position": position,
                                                          "line": call.lineno})


def _methods_called_on(index: Index, call: ast.Call, loop) -> list[dict]:
    """Methods the loop calls on the object a call builds: `Evaluator(model).score()`, or `ev = Evaluator(model)`
    then `ev.score()` later in the loop."""
    parent = index.parent(call)
    if isinstance(parent, ast.Attribute):
        outer = index.parent(parent)
        if isinstance(outer, ast.Call) and outer.func is parent:
            return [{"name": parent.attr, "line": outer.lineno, "col": outer.col_offset + 1}]
        return []
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1):
        return []
    bound = dotted(parent.targets[0])
    if bound is None:
        return []
    return [{"name": c.func.attr, "line": c.lineno, "col": c.col_offset + 1} for c in loop.all_calls()
            if isinstance(c.func, ast.Attribute) and dotted(c.func.value) == bound
            and (c.lineno, c.col_offset) > (call.lineno, call.col_offset)]


def _leave_loop(ctx: Context, loop, events: list[Event]) -> None:
    """For the project pass: a training loop whose mode switches depend on functions of other files."""
    index = ctx.index
    rows = []
    for kind, call, keys in events:
        row = {"kind": kind, "line": call.lineno, "col": call.col_offset + 1, "keys": sorted(keys)}
        if kind == "call":
            row["callee"] = index.resolve(call.func)
            row["models"] = {str(i): k for i, k in (_external_model_call(index, call) or {}).items()}
            row["shown"] = ctx.segment(call.func, 40)
            row["methods"] = _methods_called_on(index, call, loop)
        rows.append(row)
    where = f"the loop over `{loop.source}`" if loop.source else f"the training loop at line {loop.line}"
    ctx.leave("TD602-loop", {"events": rows, "loop": where})


@project("TD602")
def train_mode_not_restored_across_files(project: Project) -> list[ProjectHit]:
    """A training loop that calls `eval_net(net, ...)` from another file, which leaves `net` in eval mode."""
    evals: dict[tuple[str, str], tuple[int, int, str]] = {}
    for f, fact in project.facts("evals-param"):
        evals[(f.module, fact["function"])] = (fact["position"], fact["line"], f.path)
    # (module, class) -> method -> (position of the constructor parameter it leaves in eval mode, line, path)
    methods: dict[tuple[str, str], dict[str, tuple[int, int, str]]] = {}
    for f, fact in project.facts("evals-constructor-param"):
        methods.setdefault((f.module, fact["class"]), {})[fact["method"]] = (fact["position"], fact["line"], f.path)
    if not evals and not methods:
        return []
    hits = []
    for f, fact in project.facts("TD602-loop"):
        rows = []
        resolved: dict[tuple[int, int], str] = {}
        for row in fact["events"]:
            kind, keys = row["kind"], frozenset(row["keys"])
            at = (row["line"], row["col"])
            if kind == "call":
                defined = project.defining(row["callee"] or "")
                found = [x for x in (evals.get((g.module, name)) for g, name in defined) if x is not None]
                shown = row["shown"]
                if not found:  # a class built around the model, whose method the loop then calls
                    for g, name in defined:
                        by_method = methods.get((g.module, name), {})
                        for m in row.get("methods", ()):
                            if m["name"] in by_method:
                                found, at, shown = [by_method[m["name"]]], (m["line"], m["col"]), \
                                    f"{row['shown']}(...).{m['name']}"
                                break
                        if found:
                            break
                key = row["models"].get(str(found[0][0])) if found else None
                if key is None:
                    continue
                kind, keys = "eval", frozenset({key})
                resolved[at] = f" (set at line {found[0][1]} of {found[0][2]}, inside `{shown}()`)"
            rows.append((kind, at, keys))
        stale = _stale_eval(rows)  # type: ignore[arg-type]
        if stale is not None and stale in resolved:
            key = next(iter(next(k for _, at, k in rows if at == stale)))
            hits.append(ProjectHit(f.path, stale[0], stale[1], {
                "variable": key, "loop": fact["loop"], "via": resolved[stale],
                "train_not_restored": True}))
    return hits


def _leaves_loop(index: Index, call: ast.Call, depth: int) -> bool:
    """`model.eval(); test(model); break`: the block leaves the training loop after it (a `return`
    inside a called evaluation function only returns to the loop)."""
    stmt = index.statement_of(call)
    parent = index.parent(stmt) if stmt is not None else None
    exits = (ast.Break, ast.Return, ast.Raise) if depth == 0 else (ast.Raise,)
    for name in ("body", "orelse"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and stmt in block:
            return any(isinstance(s, exits) for s in block[block.index(stmt) + 1 :])
    return False


def _external_model_call(index: Index, call: ast.Call) -> dict[int, str] | None:
    """`eval_net(net, val_loader)` where `eval_net` is imported from another module of the project (not torch,
    not a library we know): {argument position: model key} of the models it is handed, for the project pass."""
    q = index.resolve(call.func)
    if q is None or q.split(".", 1)[0] in _LIBRARIES or isinstance(call.func, ast.Attribute) and \
            isinstance(call.func.value, ast.Name) and call.func.value.id == "self":
        return None
    models = {i: _model_key(a) for i, a in enumerate(call.args)
              if isinstance(a, ast.Name | ast.Attribute) and index.is_model(a) and _model_key(a)}
    return models or None  # type: ignore[return-value]


_LIBRARIES = frozenset("torch torchvision numpy np tqdm os sys math random time logging json wandb "
                       "transformers accelerate lightning pytorch_lightning timm datasets".split())


def _stale_eval(events: list[Event]) -> ast.Call | None:
    """Run the loop body twice: the first `.eval()` still in force when a training step runs, if any."""
    stale = _stale_evals(events)
    return stale[0] if stale else None


def _stale_evals(events: list[Event]) -> list[ast.Call]:
    """Every `.eval()` still in force when a training step runs, in the order the steps meet them (models of one
    step in name order: a step's keys are a set, and the finding must not depend on the hash seed)."""
    state: dict[str, ast.Call | None] = {}
    found: list[ast.Call] = []
    for _ in range(2):
        for kind, call, keys in events:
            if kind == "eval":
                for k in keys:
                    state[k] = call
            elif kind == "train":
                for k in keys:
                    state[k] = None
            elif kind == "step":
                for k in sorted(keys):
                    stale = state.get(k)
                    if stale is not None and stale not in found:
                        found.append(stale)
        if found:
            return found
    return found


# -- anomaly detection -----------------------------------------------------------------------


def _under_condition(index: Index, node: ast.AST) -> bool:
    for anc in index.ancestors(node):
        if isinstance(anc, ast.If | ast.IfExp | ast.Try):
            return True
        if isinstance(anc, ast.FunctionDef | ast.AsyncFunctionDef):
            return "debug" in anc.name.lower() or anc.name.startswith("test")
    return False


def _contains_training(index: Index, block: ast.AST) -> bool:
    """A training loop inside the block (a lone backward pass is a one-off check)."""
    start, end = block.lineno, block.end_lineno or block.lineno  # type: ignore[attr-defined]
    return any(start <= lp.node.lineno <= end and lp.trains for lp in index.loops.values())


@rule("TD603", ast.Module)
def anomaly_detection_left_on(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in index.calls_to(*sorted(_ANOMALY_SET | _ANOMALY_CONTEXT)):
        _anomaly_detection_left_on(call, ctx)


def _anomaly_detection_left_on(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    q = index.callee(node)
    if q in _ANOMALY_SET:
        if not is_constant(kwarg(node, "mode", 0), True):
            return
    elif q not in _ANOMALY_CONTEXT:
        return
    if not index.backward_calls or _under_condition(index, node):
        return
    parent = index.parent(node)
    if isinstance(parent, ast.withitem):
        block = index.parent(parent)
        if not (_contains_training(index, block) or index.training_loop_of(block) is not None):
            return  # one debugging pass, not the training run
    elif isinstance(parent, ast.Expr):
        if q in _ANOMALY_SET and any(
            is_constant(kwarg(c, "mode", 0), False) for c in index.calls_to(*sorted(_ANOMALY_SET))
        ):
            return  # switched off again later
        if not index.training_loops() and not index.training_functions:
            return
    elif isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
        if parent not in index.training_functions:
            return
    else:
        return
    ctx.report(node, variable=snippet(ctx, node, 60))


# -- log(softmax) ----------------------------------------------------------------------------


def _strip_guards(index: Index, expr: ast.AST) -> ast.AST:
    """`softmax(x) + 1e-8`, `softmax(x).clamp(min=eps)`, `torch.clamp(p, eps)`: still log of a softmax."""
    for _ in range(4):
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            if isinstance(expr.right, ast.Constant) or isinstance(expr.right, ast.Name):
                expr = expr.left
                continue
        if isinstance(expr, ast.Call):
            q = index.resolve(expr.func)
            if q in ("torch.clamp", "torch.clip", "torch.clamp_min") and expr.args:
                expr = expr.args[0]
                continue
            if isinstance(expr.func, ast.Attribute) and expr.func.attr in ("clamp", "clip", "clamp_min") and q is None:
                expr = expr.func.value
                continue
        break
    return expr


@rule("TD604", ast.Module)
def log_of_softmax(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in [*index.calls_to("torch.log"), *index.method_calls("log")]:
        _log_of_softmax(call, ctx)


def _log_of_softmax(node: ast.Call, ctx: Context) -> None:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "log":
        index = ctx.index
        q = index.resolve(func)
        if q == "torch.log":
            inner = kwarg(node, "input", 0)
        elif q is None and not node.args and not node.keywords:
            inner = func.value
        else:
            return
    else:
        return
    if inner is None or not _log_of_softmax_output(index, inner, node):
        return
    if _infinities_replaced(index, node):
        return  # `prob = -torch.log(p)` then `torch.where(torch.isinf(prob), 0, prob)`: the -inf is handled
    ctx.report(node, variable=snippet(ctx, inner, 50))


def _log_of_softmax_output(index: Index, inner: ast.AST, at: ast.AST) -> bool:
    """What TD604 reports: the log's argument is a softmax output itself, called there or bound to a name
    (`p = self.softmax(x)`), with no epsilon or clamp (`log(softmax(x) + eps)` is finite: the common fix)."""
    probs = _strip_guards(index, inner)
    if is_softmax_call(index, probs) is None and not (
        isinstance(probs, ast.Name) and is_probabilities(index, probs, at)
    ):
        return False
    return probs is inner


_INF_CHECKS = frozenset({"torch.isinf", "torch.isnan", "torch.isfinite", "torch.nan_to_num", "torch.isneginf"})


def _infinities_replaced(index: Index, node: ast.Call) -> bool:
    """The log's result is bound to a name that the same function later tests for inf/nan (`torch.isinf(prob)`,
    `prob.isinf()`, `torch.nan_to_num(prob)`): the code replaces the infinities itself."""
    stmt = index.statement_of(node)
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
        return False
    name, fn = stmt.targets[0].id, index.function_of(node)
    for call in index.nodes(ast.Call):
        if call.lineno <= stmt.lineno or index.function_of(call) is not fn:  # type: ignore[attr-defined]
            continue
        func = call.func  # type: ignore[attr-defined]
        if index.resolve(func) in _INF_CHECKS:
            arg = kwarg(call, "input", 0)  # type: ignore[arg-type]
        elif isinstance(func, ast.Attribute) and func.attr in ("isinf", "isnan", "isfinite", "nan_to_num"):
            arg = func.value
        else:
            continue
        if isinstance(arg, ast.Name) and arg.id == name:
            return True
    return False


# -- log of a value that can be 0 ----------------------------------------------------------------

_LOG_FUNCTIONS = frozenset({"torch.log", "torch.log2", "torch.log10"})


def _in_loss_code(index: Index, node: ast.AST) -> bool:
    """The log is part of a loss: its function or class is named for one (`_neg_loss`, `FocalLoss.forward`),
    or its statement binds a name that is (`pos_loss = torch.log(pred) * ...`)."""
    fn = index.function_of(node)
    if fn is not None and "loss" in fn.name.lower():
        return True
    info = index.class_of(node)
    if info is not None and "loss" in info.name.lower():
        return True
    stmt = index.statement_of(node)
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, ast.AugAssign | ast.AnnAssign) else []
    if any("loss" in (dotted(t) or "").lower() for t in targets):
        return True
    # a function whose value a call of this file uses as a loss: backward runs on it, or it is bound to a loss
    return fn is not None and lossuse.computes_a_loss(index, fn)


@rule("TD609", ast.Module)
def log_of_zero(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    calls = [*index.calls_to(*sorted(_LOG_FUNCTIONS)), *index.method_calls("log")]
    # One finding per function (its logs share one cause): the first whose claim the function shows itself, else
    # the first at all (at info).
    chosen: dict[ast.AST | None, tuple[ast.Call, str, bool]] = {}
    for call in sorted(set(calls), key=lambda c: (c.lineno, c.col_offset)):
        fn = index.function_of(call)
        if fn in chosen and not chosen[fn][2]:
            continue
        found = _log_of_zero(call, ctx)
        if found is not None and (fn not in chosen or not found[1]):
            chosen[fn] = (call, found[0], found[1])
    for call, why, weak in chosen.values():
        ctx.report(call, severity="info" if weak else None, variable=snippet(ctx, call, 50), why=why)
    _leave_squashed_calls(ctx)


def _leave_squashed_calls(ctx: Context) -> None:
    """For the project pass: calls of another file's function handed a sigmoid or softmax output
    (`loss = soft_target_loss(torch.softmax(model(x), 1), target)`), by argument position, and whether the call's
    value is used as a loss."""
    index = ctx.index
    text = index.lowered()
    if "softmax" not in text and "sigmoid" not in text:
        return
    for call in index.nodes(ast.Call):
        func = call.func  # type: ignore[attr-defined]
        if not call.args or not isinstance(func, ast.Name | ast.Attribute) or index.local_target(call) is not None:  # type: ignore[attr-defined]
            continue
        q = index.resolve(func)
        if q is None or q.split(".", 1)[0] in ("torch", "numpy", "math", "builtins"):
            continue
        kinds = {str(i): kind for i, arg in enumerate(call.args)  # type: ignore[attr-defined]
                 if not isinstance(arg, ast.Starred) and (kind := _squashed(index, arg)) is not None}
        if kinds:
            ctx.leave("squashed-at-call", {"callee": q, "kinds": kinds, "loss": lossuse.used_as_loss(index, call),  # type: ignore[arg-type]
                                           "line": call.lineno})  # type: ignore[attr-defined]


@project("TD609")
def log_of_zero_across_files(project: Project) -> list[ProjectHit]:
    """losses.py takes `torch.log(probs)` of a bare parameter; engine.py calls it with `torch.softmax(...)`: the log
    can see 0. Reported when a call in another file hands the parameter a sigmoid or softmax output, and the function
    is loss code by its own name or that call uses its value as a loss."""
    logs = {(f.module, fact["function"]): (f, fact) for f, fact in project.facts("TD609-param-log")}
    if not logs:
        return []
    hits = []
    done: set[tuple[str, str]] = set()
    for g, fact in project.facts("squashed-at-call"):
        for owner, name in project.defining(fact["callee"] or ""):
            key = (owner.module, name)
            if key in done or key not in logs:
                continue
            f, log = logs[key]
            kind = fact["kinds"].get(str(log["position"]))
            if kind is None or not (log["loss"] or fact["loss"]):
                continue
            done.add(key)
            hits.append(ProjectHit(f.path, log["line"], log["col"], {
                "variable": log["variable"],
                "why": f"handed a {kind} output by {g.path} (line {fact['line']}), which underflows to 0 "
                       "(and rounds to 1)"}))
    return hits


def _log_of_zero(node: ast.Call, ctx: Context) -> tuple[str, bool] | None:
    """(why the log's argument can be 0, whether that rests on a value the function did not make) or None."""
    index = ctx.index
    func = node.func
    q = index.resolve(func)
    if q in _LOG_FUNCTIONS:
        inner = kwarg(node, "input", 0)
    elif isinstance(func, ast.Attribute) and func.attr == "log" and q is None and not node.args and not node.keywords:
        inner = func.value
    else:
        return None
    if inner is None:
        return None
    if not _in_loss_code(index, node):
        _leave_param_log(ctx, node, inner, in_loss=False)  # a call in another file may use it as a loss
        return None
    if is_softmax_call(index, inner) is not None or _log_of_softmax_output(index, inner, node):
        return None  # log(softmax(x)), also through a name: TD604 says it, with its own fix (one cause, one finding)
    why = zero_reachable(index, inner, node)
    # Only a complement `1 - p` of a value this function did not squash itself (a parameter: CenterNet's focal loss
    # gets its prediction clamped to [1e-4, 1 - 1e-4] three calls away): whether p can round to 1 is the caller's.
    weak = why is not None and zero_reachable(index, inner, node, seen=True) is None \
        and not _squashed_by_a_caller(index, node, inner)
    if (why is None or weak) and not _floored_input(index, inner) and _feeds_nll(index, node):
        why = "a probability tensor (its log is the input of an NLL loss), which is 0 where the softmax underflows"
        weak = False
    if why is None and isinstance(inner, ast.Name):
        handed = _squashed_by_a_caller(index, node, inner)
        if handed is not None:
            why, weak = handed, False  # the bare parameter itself: a caller of this file hands it probabilities
    if why is None:
        _leave_param_log(ctx, node, inner, in_loss=True)
        return None
    return why, weak


def _params(fn: ast.AST) -> list[str]:
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]  # type: ignore[attr-defined]
    return params[1:] if params and params[0] in ("self", "cls") else params


def _squashed(index: Index, arg: ast.AST) -> str | None:
    """'sigmoid' or 'softmax' when a value handed to a call is one's output (through the caller's names)."""
    if _is_sigmoid(index, arg, sequential=True):
        return "sigmoid"
    if is_softmax_call(index, arg) is not None or isinstance(arg, ast.Name) and is_probabilities(index, arg, arg):
        return "softmax"
    return None


def _squashed_by_a_caller(index: Index, node: ast.AST, inner: ast.AST) -> str | None:
    """Why the parameter under the log can be 0 when a call of this file hands it a sigmoid or softmax output
    (PyTorch-GAN's bgan: `boundary_seeking_loss(discriminator(gen_imgs), valid)`, a discriminator ending in
    nn.Sigmoid; `l = f(o, t)` with `o = torch.softmax(net(x), 1)`), also a call through a name or a table that holds
    the function (`LOSSES[args.loss](out, y)`)."""
    fn = index.function_of(node)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    params = _params(fn)
    used = {n.id for n in ast.walk(inner) if isinstance(n, ast.Name)} & set(params)
    used -= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}  # rebound here
    for call in lossuse.calls_of(index, fn):
        for name in used:
            arg = kwarg(call, name, params.index(name))
            kind = _squashed(index, arg) if arg is not None else None
            if kind is not None:
                return f"handed a {kind} output by the call at line {call.lineno}, which underflows to 0 (and rounds to 1)"
    return None


def _leave_param_log(ctx: Context, node: ast.Call, inner: ast.AST, in_loss: bool) -> None:
    """For the project pass: a log of a bare parameter of a module-level function whose callers are all in other
    files (`soft_target_loss(probs, target)` in losses.py, called from engine.py with a softmax)."""
    index = ctx.index
    fn = index.function_of(node)
    if not isinstance(inner, ast.Name) or not isinstance(fn, ast.FunctionDef) or index.class_of(fn) is not None \
            or index.functions.get(fn.name) is not fn or lossuse.calls_of(index, fn):
        return
    params = _params(fn)
    if inner.id not in params or any(isinstance(n, ast.Name) and n.id == inner.id and isinstance(n.ctx, ast.Store)
                                      for n in ast.walk(fn)):
        return
    ctx.leave("TD609-param-log", {"function": fn.name, "position": params.index(inner.id), "param": inner.id,
                                  "loss": in_loss, "line": node.lineno, "col": node.col_offset + 1,  # type: ignore[attr-defined]
                                  "variable": snippet(ctx, node, 50)})


_NLL = frozenset({"torch.nn.NLLLoss", "torch.nn.functional.nll_loss"})


def _floored_input(index: Index, expr: ast.AST) -> bool:
    """`p + eps`, `p.clamp(min=eps)`, arithmetic of any kind: not the bare probabilities."""
    return not isinstance(expr, ast.Name | ast.Attribute | ast.Subscript)


def _feeds_nll(index: Index, node: ast.Call) -> bool:
    """Use says the log's argument is a probability tensor: the log is the input of `F.nll_loss` / an
    `nn.NLLLoss()` (directly or through the name it is bound to), or runs under `if isinstance(criterion,
    nn.NLLLoss):` (skorch's `get_loss`, which logs the module's softmax output for its default NLLLoss)."""
    for anc in index.ancestors(node):
        if isinstance(anc, ast.If) and any(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "isinstance" and len(c.args) == 2
            and index.resolve(c.args[1]) in _NLL for c in ast.walk(anc.test)
        ):
            return True
        if isinstance(anc, ast.Call) and _is_nll_call(index, anc) and kwarg(anc, "input", 0) is node:
            return True
    stmt = index.statement_of(node)
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and stmt.value is node):
        return False
    name, fn = stmt.targets[0].id, index.function_of(node)
    return any(_is_nll_call(index, c) and isinstance(arg := kwarg(c, "input", 0), ast.Name) and arg.id == name
               and c.lineno > stmt.lineno for c in index.nodes(ast.Call) if index.function_of(c) is fn)  # type: ignore[arg-type]


def _is_nll_call(index: Index, call: ast.Call) -> bool:
    if index.resolve(call.func) in _NLL:
        return True
    b = index.binding(call.func)
    return b is not None and b.kind == "loss" and b.cls in _NLL


# -- BCE on sigmoid --------------------------------------------------------------------------


def _is_sigmoid(index: Index, expr: ast.AST | None, depth: int = 0, sequential: bool = False) -> bool:
    """A sigmoid output; with `sequential`, also a submodule `nn.Sequential(..., nn.Sigmoid())` of the model (TD609's
    reading of what a caller hands in; TD605 keeps its narrower reading)."""
    if expr is None or depth > 8:
        return False
    if isinstance(expr, ast.Name):
        value = latest_value(index, expr.id, expr)
        return value is not None and _is_sigmoid(index, value, depth + 1, sequential)
    if not isinstance(expr, ast.Call):
        return False
    func = expr.func
    q = index.resolve(func)
    if q in _SIGMOID:
        return True
    if q in ("torch.clamp", "torch.clip") and expr.args:
        return _is_sigmoid(index, expr.args[0], depth + 1, sequential)
    if isinstance(func, ast.Attribute) and q is None:
        if func.attr == "sigmoid" and not expr.args:
            return True
        if func.attr in _SHAPE_METHODS or func.attr in ("clamp", "clip"):
            return _is_sigmoid(index, func.value, depth + 1, sequential)
        if func.attr == "sigmoid":
            return False
    if isinstance(func, ast.Call) and index.resolve(func.func) == "torch.nn.Sigmoid":
        return True
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        info = index.class_of(func)
        if info is not None:
            for assign in index.self_assignments(info, None):
                if assign.attr == func.attr and isinstance(assign.value, ast.Call):
                    made = assign.value
                    if sequential and index.resolve(made.func) == "torch.nn.Sequential" and made.args:
                        last = made.args[-1]
                        return isinstance(last, ast.Call) and index.resolve(last.func) == "torch.nn.Sigmoid"
                    return index.resolve(made.func) == "torch.nn.Sigmoid"
        return False
    return _model_ends_in_sigmoid(index, func, sequential)


def _model_ends_in_sigmoid(index: Index, func: ast.AST, sequential: bool = False) -> bool:
    b = index.binding(func)
    if b is None or b.kind != "module" or b.call is None:
        return False
    if b.cls == "torch.nn.Sequential" and b.call.args:
        last = b.call.args[-1]
        return isinstance(last, ast.Call) and index.resolve(last.func) == "torch.nn.Sigmoid"
    info = index.classes.get(b.cls or "")
    if info is None or not info.is_module:
        return False
    forward = info.method("forward")
    if forward is None:
        return False
    returns = [n.value for n in ast.walk(forward) if isinstance(n, ast.Return) and n.value is not None]
    return bool(returns) and all(_is_sigmoid(index, r, 1, sequential) for r in returns)


def _bce_candidates(index: Index) -> list[ast.Call]:
    """Calls of F.binary_cross_entropy, of a BCELoss binding, or of an inline `nn.BCELoss()`."""
    found = list(index.calls_to("torch.nn.functional.binary_cross_entropy", "torch.binary_cross_entropy"))
    for b in index.bindings_of("loss"):
        if b.cls == "torch.nn.BCELoss":
            found += index.calls_by_name.get(b.name, [])
    for construct in index.calls_to("torch.nn.BCELoss"):
        parent = index.parent(construct)
        if isinstance(parent, ast.Call) and parent.func is construct:
            found.append(parent)
    return found


@rule("TD605", ast.Module)
def bce_on_sigmoid(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in _bce_candidates(index):
        _bce_on_sigmoid(call, ctx)


def _bce_on_sigmoid(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    func = node.func
    q = index.resolve(func)
    if q in ("torch.nn.functional.binary_cross_entropy", "torch.binary_cross_entropy"):
        probs = kwarg(node, "input", 0)
        loss = dotted(func) or "binary_cross_entropy"
    elif isinstance(func, ast.Call) and index.resolve(func.func) == "torch.nn.BCELoss":
        probs = kwarg(node, "input", 0)
        loss = "nn.BCELoss()"
    elif isinstance(func, ast.Name | ast.Attribute):
        b = index.binding(func)
        if b is None or b.kind != "loss" or b.cls != "torch.nn.BCELoss":
            return
        probs = kwarg(node, "input", 0)
        loss = dotted(func) or "BCELoss"
    else:
        return
    if probs is None or not _is_sigmoid(index, probs):
        return
    ctx.report(node, variable=snippet(ctx, probs, 40), loss=loss)


# -- TD606 -------------------------------------------------------------------------------------


@rule("TD606", ast.Module)
def training_in_validation(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    backward = set(index.backward_calls)
    steps = set(index.step_calls)
    for loop in index.loops.values():
        if not (loop.has_backward or loop.has_step) or not is_eval_word(loop.source):
            continue
        mode = index.eval_mode_before(loop)
        if mode is None:
            continue  # a loader named `test_*` without eval mode: test-time training is deliberate
        update = next((c for c in loop.calls if c in backward or c in steps), None)
        if update is not None:
            ctx.report(update, variable=loop.source, update=ctx.segment(update, 40),
                       model=ctx.segment(mode.func.value, 40), line=mode.lineno)  # type: ignore[attr-defined]


# -- TD610 -------------------------------------------------------------------------------------


def _none_test(test: ast.AST) -> tuple[str, bool] | None:
    """(name, True when the body runs with it set) for `x is not None`, `x`, `x is None`, `not x`."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value is None and isinstance(test.ops[0], ast.Is | ast.IsNot):
        name = dotted(test.left)
        return (name, isinstance(test.ops[0], ast.IsNot)) if name else None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        name = dotted(test.operand)
        return (name, False) if name else None
    name = dotted(test)
    return (name, True) if name else None


def _step_guard(index: Index, step: ast.Call, fn: ast.AST) -> tuple[ast.If, str] | None:
    """The `if opt is not None:` (in `fn`) that the optimizer step sits under, testing the stepped optimizer
    itself: the function is written to run without one."""
    func = step.func
    stepped = {dotted(func.value)} | {dotted(a) for a in step.args[:1]}  # type: ignore[attr-defined]
    stepped |= {n.rpartition(".")[0] for n in list(stepped) if n and n.endswith(".optimizer")}  # `self.opt.optimizer`
    child: ast.AST = step
    for anc in index.ancestors(step):
        if anc is fn:
            return None
        if isinstance(anc, ast.If):
            tested = _none_test(anc.test)
            if tested is not None and tested[0] in stepped:
                in_body = child in anc.body
                if in_body == tested[1] and not (anc.orelse if in_body else anc.body):
                    return anc, tested[0]
        child = anc
    return None


@rule("TD610", ast.Module)
def backward_without_optimizer(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    steps_by_fn: dict[ast.AST, list[ast.Call]] = {}
    for step in index.step_calls:
        fn = index.function_of(step)
        if fn is not None:
            steps_by_fn.setdefault(fn, []).append(step)
    for call in index.backward_calls:
        fn = index.function_of(call)
        steps = steps_by_fn.get(fn) if fn is not None else None
        if not steps or index.guarded_in_function(call):
            continue
        guards = [_step_guard(index, s, fn) for s in steps]
        if any(g is None for g in guards):
            continue  # some step runs whatever: the backward has its update
        guard, name = guards[0]  # type: ignore[misc]
        if call.lineno > guard.lineno:
            continue
        ctx.report(call, variable=ctx.segment(call, 40), optimizer=name, line=guard.lineno)


# -- TD607 -------------------------------------------------------------------------------------


def _scalar_loss(index: Index, expr: ast.AST, depth: int = 0) -> bool:
    """A 0-dim tensor: a loss function's output (reduced by default), `x.sum()`/`x.mean()`, or a name
    bound to one (also a name that says it is a loss)."""
    if depth > 3:
        return False
    if isinstance(expr, ast.Call):
        if isinstance(expr.func, ast.Attribute) and expr.func.attr in ("sum", "mean") and not expr.args \
                and not expr.keywords:
            return True
        return is_loss_callable(index, expr.func) and kwarg(expr, "reduction") is None
    if isinstance(expr, ast.Name):
        value = latest_value(index, expr.id, expr)
        if value is not None:
            return _scalar_loss(index, value, depth + 1)
        return "loss" in expr.id.lower()
    return False


@rule("TD607", ast.Module, reads=(ast.Subscript,))
def index_into_scalar_loss(node: ast.Module, ctx: Context) -> None:
    # `loss.data[0]`: one loop over the file's subscripts, with the cheap test of the shape first, instead of a
    # check called on every subscript of the file
    attribute = ast.Attribute
    for sub in ctx.index.nodes(ast.Subscript):
        value = sub.value  # type: ignore[attr-defined]
        if not (value.__class__ is attribute and value.attr == "data" and is_constant(sub.slice, 0)):  # type: ignore[attr-defined]
            continue
        if isinstance(sub.ctx, ast.Load) and _scalar_loss(ctx.index, value.value):  # type: ignore[attr-defined]
            ctx.report(sub, variable=ctx.segment(value.value, 40), expr=ctx.segment(sub, 50))


# Names that say a tensor marks elements the data decides: the positive anchors, the valid tokens, a loss's or
# labels' mask. A bare `mask` is not enough: on the dev corpus every such count (MAE's random patch masks, VITS's
# sequence-length masks) was full by construction, 9 false findings of 9.
_MASK_WORDS = ("pos", "positive", "valid", "keep", "selected")
_MASK_NAMES = ("loss_mask", "label_mask", "labels_mask", "target_mask", "targets_mask")
# Tensor methods that keep a count a count (a dtype or a host copy of it).
_SAME_COUNT = frozenset({"item", "float", "long", "int", "double", "half", "to", "cuda", "cpu", "detach", "type",
                         "type_as", "bool"})


def _mask_like(index: Index, expr: ast.AST, depth: int = 0) -> bool:
    """A tensor of 0/1 marks: a comparison (`cls_targets > 0`), a cast of one, or a name that says so."""
    if depth > 6:
        return False
    if isinstance(expr, ast.Compare):
        return True
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _SAME_COUNT:
        return _mask_like(index, expr.func.value, depth + 1)
    if isinstance(expr, ast.Subscript):
        return _mask_like(index, expr.value, depth + 1)
    if isinstance(expr, ast.Name | ast.Attribute):
        value = latest_value(index, expr.id, expr) if isinstance(expr, ast.Name) else None
        if value is not None:
            return _mask_like(index, value, depth + 1)
        last = (dotted(expr) or "").rsplit(".", 1)[-1].lower()
        return any(w in last.split("_") or last.endswith(w) for w in _MASK_WORDS) or last.endswith(_MASK_NAMES)
    return False


def _count_that_can_be_zero(index: Index, expr: ast.AST, depth: int = 0) -> str | None:
    """Why a denominator can be exactly 0: it counts the marked elements of a mask (`mask.sum()`,
    `pos.sum().item()`, `torch.sum(valid)`), and a batch can mark none. None when it is kept off 0 on the way
    (`.clamp(min=1)`, `max(n, 1)`, `+ eps`) or not a count."""
    if depth > 6:
        return None
    if isinstance(expr, ast.Name):
        value = latest_value(index, expr.id, expr)
        return _count_that_can_be_zero(index, value, depth + 1) if value is not None else None
    if not isinstance(expr, ast.Call):
        return None  # `n + eps`, `max(n, 1)`, a constant: kept off 0, or not a count
    func = expr.func
    if isinstance(func, ast.Attribute) and func.attr in _SAME_COUNT and not expr.args:
        return _count_that_can_be_zero(index, func.value, depth + 1)
    counted = None
    if isinstance(func, ast.Attribute) and func.attr in ("sum", "count_nonzero") and not expr.args \
            and not expr.keywords:
        counted = func.value
    elif index.resolve(func) in ("torch.sum", "torch.count_nonzero") and len(expr.args) == 1 and not expr.keywords:
        counted = expr.args[0]
    if counted is not None and _mask_like(index, counted):
        return f"`{ast.unparse(expr)[:40]}`, the number of marked elements, which is 0 for a batch that marks none"
    return None


def _tested(index: Index, node: ast.AST, counts: set[str], masks: set[str]) -> bool:
    """The function tests for the empty batch before it divides: the count itself (`if num_pos > 0:`,
    `assert n`, `torch.where(n > 0, ...)`), or what the mask holds (`if pos.any():`, `if mask.sum() == 0:`).
    A test that the mask exists (`if loss_mask is not None:`) is not one."""
    fn = index.function_of(node) or index.tree
    for n in ast.walk(fn):
        test = n.test if isinstance(n, ast.If | ast.IfExp | ast.While | ast.Assert) else None
        if test is None and isinstance(n, ast.Call) and index.resolve(n.func) == "torch.where" and n.args:
            test = n.args[0]
        if test is None:
            continue
        for m in ast.walk(test):
            if (dotted(m) or "") in counts:
                return True
            if isinstance(m, ast.Call) and isinstance(m.func, ast.Attribute) \
                    and m.func.attr in ("any", "all", "sum", "numel", "nonzero", "count_nonzero") \
                    and (dotted(m.func.value) or "") in masks:
                return True
    return False


@rule("TD611", ast.BinOp, ops=(ast.Div,))
def division_by_empty_count(node: ast.BinOp, ctx: Context) -> None:
    if not isinstance(node.op, ast.Div):
        return
    index = ctx.index
    if not _in_loss_code(index, node):
        return
    why = _count_that_can_be_zero(index, node.right)
    if why is None:
        return
    counts = {node.right.id} if isinstance(node.right, ast.Name) else set()
    value = latest_value(index, node.right.id, node.right) if isinstance(node.right, ast.Name) else node.right
    masks = {d for m in ast.walk(value) if isinstance(m, ast.Name | ast.Attribute) and (d := dotted(m))} \
        if value is not None else set()
    if _tested(index, node, counts, masks - {"torch"}):
        return
    ctx.report(node, variable=snippet(ctx, node, 50), why=why)


@project("TD601")
def evaluation_mode_unlike_the_projects_others(project: Project) -> list[ProjectHit]:
    """An evaluation function that runs the model under no_grad without `.eval()` where the project's other
    evaluation functions call it (semantic/practice.py)."""
    return practice.hits(project, "eval", lambda site, text: {
        "variable": site["variable"], "loader": site["loader"],
        "cause": f"nothing in `{site['function']}` calls `.eval()`, so it keeps the mode its caller left (training, "
                 f"after a training loop), while {text}"})

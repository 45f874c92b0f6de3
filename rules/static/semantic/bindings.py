"""What a name holds: the kind of training object bound to it (loader, optimizer, model, ...), from its
constructor or from its name."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import (
    dotted,
    element_container,
    keyed_name,
    kwarg,
    last_name,
)
from torchdoctor.rules.static.semantic.vocabulary import canonical

if TYPE_CHECKING:
    from torchdoctor.rules.static.semantic.bindings import Binding
    from torchdoctor.rules.static.semantic.projectclasses import ProjectClasses


@dataclass
class Binding:
    """What a name holds after `name = <call>`: kind, class and the call's arguments."""

    name: str  # "loader", "self.loader"
    kind: str  # dataloader | sampler | scheduler | optimizer | scaler | autocast | module | loss | grad-mode
    cls: str | None  # qualified callee or local class name
    node: ast.AST  # the assignment statement
    call: ast.Call | None = None
    wrapper: str | None = None  # ddp | fsdp | dp | accelerate (modules)
    compiled: bool = False
    inner: str | None = None  # the wrapped name: DDP(model) -> "model"
    guessed: bool = False  # kind guessed from the name only (e.g. a function parameter `loader`)

    @property
    def kwargs(self) -> dict[str, ast.expr]:
        if self.call is None:
            return {}
        return {kw.arg: kw.value for kw in self.call.keywords if kw.arg is not None}

    @property
    def star_kwargs(self) -> bool:
        """`**options` or `*args` were passed: some arguments are unknown."""
        if self.call is None:
            return False
        return any(kw.arg is None for kw in self.call.keywords) or any(
            isinstance(a, ast.Starred) for a in self.call.args
        )

    def arg(self, name: str, position: int | None = None) -> ast.expr | None:
        return kwarg(self.call, name, position) if self.call is not None else None

    @property
    def short_cls(self) -> str | None:
        return self.cls.rsplit(".", 1)[-1] if self.cls else None

_MODEL_NAME = re.compile(r"(?:^|_)(?:model|net|network|backbone)s?$|model$", re.I)
_LOADER_NAME = re.compile(r"loader|(?:^|_)dl$|^dl_", re.I)
_OPTIMIZER_NAME = re.compile(r"(?:^|_)(?:optim|optimizer|optimiser|opt)s?(?:_|$)|optimizer", re.I)
_SCALER_NAME = re.compile(r"scaler$", re.I)
_LOSS_ENDS = ("loss", "loss_fn", "lossfn", "loss_func", "loss_function")
_SCALER_CLASS = re.compile(r"^(?:Native|Grad|Amp|Loss)Scaler")
# Values `_bind_target` binds nothing to when the target is one name (a tuple target takes a tuple value apart):
# `_classify` reads calls, names, attributes and conditional expressions, and `_bind_target` dicts and subscripts.
_HOLDS_NO_KIND = frozenset({ast.Constant, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.JoinedStr, ast.List,
                            ast.Tuple, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda})
# The parts of an adversarial setup, by their usual names: `netG`, `net_d`, `G`, `D`, `gen`, `discriminator`.
_PART_NAME = re.compile(r"^(?:net_?[gd]|[gd]|gen|disc|critic)$|generator|discriminator", re.I)
_MODULE_METHODS = ("parameters", "named_parameters", "train", "eval", "zero_grad", "state_dict", "requires_grad_")

def looks_like_model(name: str | None) -> bool:
    return bool(name) and bool(_MODEL_NAME.search(name.rsplit(".", 1)[-1]))

def looks_like_loader(name: str | None) -> bool:
    return bool(name) and bool(_LOADER_NAME.search(name.rsplit(".", 1)[-1]))


# name_kind's answers by the name's last part: a pure function of the text (four case-blind regex searches), asked
# of every value a file hands its own functions and of many names more, most of them spelled alike (`x`, `batch`).
_NAME_KINDS: dict[str, str | None] = {}


def name_kind(name: str) -> str | None:
    """The kind a name says it holds (`train_loader`, `optimizer`, `model`), or None."""
    short = name.rsplit(".", 1)[-1]
    try:
        return _NAME_KINDS[short]
    except KeyError:
        pass
    if len(_NAME_KINDS) > 50_000:
        _NAME_KINDS.clear()  # bounded: a long-lived process checking many projects
    found = _NAME_KINDS[short] = _name_kind(short)
    return found


def _name_kind(short: str) -> str | None:
    if looks_like_loader(short):
        return "dataloader"
    if _SCALER_NAME.search(short):
        return "scaler"
    if _OPTIMIZER_NAME.search(short):
        return "optimizer"
    if looks_like_model(short):
        return "module"
    return None


def class_kind(q: str, n: dict, project: ProjectClasses | None) -> str | None:
    """The kind of object a qualified class name builds (`torch.optim.lr_scheduler.StepLR` -> scheduler), from
    its name alone: for an annotation, or a class another file of the project calls."""
    short = q.rsplit(".", 1)[-1]
    if q in n["dataloaders"]:
        return "dataloader"
    if q in n["distributed_samplers"] or q in n["samplers"]:
        return "sampler"
    if any(q.startswith(p) for p in n["scheduler_prefixes"]):
        return "scheduler"
    if q in n["scalers"]:
        return "scaler"
    if short[:1].isupper() and q.count(".") == 2 and any(q.startswith(p) for p in n["optimizer_prefixes"]):
        return "optimizer"
    if q in n["ddp"] or q in n["fsdp"] or q in n["data_parallel"] or q in n["module_bases"]:
        return "module"
    if q.startswith("torch.nn.") and short[:1].isupper() and q.count(".") == 2:
        if short.endswith(n["loss_module_suffix"]):
            return "loss"
        return None if short in ("Parameter", "ParameterList", "ParameterDict", "Buffer") else "module"
    if project is not None and project.is_module_class(q):
        return "module"
    return None


def wrapper_of(q: str, n: dict) -> str | None:
    """ddp, fsdp or dp for a qualified wrapper class."""
    return "ddp" if q in n["ddp"] else "fsdp" if q in n["fsdp"] else "dp" if q in n["data_parallel"] else None

class Bindings:
    """Bindings by name; kinds from constructors, wrappers (DDP, compile, accelerate) and names."""

    def binding(self, expr: ast.AST | str | None) -> Binding | None:
        """The latest binding of a name (or Name/Attribute node) whose kind is known."""
        name = expr if isinstance(expr, str) else (dotted(expr) or keyed_name(expr))
        if name is None:
            return None
        found = self.bindings.get(name)
        return found[-1] if found else None

    def bindings_of(self, kind: str) -> list[Binding]:
        return [b for bs in self.bindings.values() for b in bs if b.kind == kind]

    def reaching(self, name: str, at: ast.AST) -> list[Binding]:
        """The bindings of `name` that may hold when `at` runs, latest first (`binding()` is simply the file's
        latest). In one scope, only bindings written before `at` count, and a binding inside a branch that does
        not hold `at` lets the earlier ones through: a notebook cell sees its own cell's scheduler, not one a
        later cell binds to the same name. A use with no earlier binding in its own function reads what the
        module (or, for `self.x`, any method) binds; with none of those either, the file's latest binding."""
        found = self.bindings.get(name)
        if not found:
            return []
        if len(found) == 1:
            return list(found)
        return self.reaching_statements([(b.node, b) for b in found], at, name)

    def reaching_statements(self, pairs: list[tuple[ast.AST, object]], at: ast.AST, name: str) -> list:
        """`reaching()` for any table of (binding statement, value) pairs of one name: the values that may
        hold at `at`, latest first."""
        fn = self.function_of(at)
        here = (getattr(at, "lineno", 0), getattr(at, "col_offset", 0))
        ordered = sorted(pairs, key=lambda p: (getattr(p[0], "lineno", 0), getattr(p[0], "col_offset", 0)))
        local = [p for p in ordered if self.function_of(p[0]) is fn
                 and (getattr(p[0], "lineno", 0), getattr(p[0], "col_offset", 0)) <= here]
        if not local:
            if fn is None:
                return [ordered[-1][1]]
            attribute = "." in name
            outer = [p for p in ordered if self.function_of(p[0]) is not fn
                     and (attribute or self.function_of(p[0]) is None or self._encloses(p[0], at))]
            return [p[1] for p in reversed(outer)] or [ordered[-1][1]]
        out = []
        conditions = self._branch_tests(at)
        for node, value in reversed(local):
            if self._dominates(node, at):
                out.append(value)
                break
            if not any(conditions.get(test, taken) != taken for test, taken in self._branch_tests(node).items()):
                out.append(value)  # not under a test the use's own branch contradicts (`if X:` vs `if not X:`)
        return out or [local[-1][1]]

    def _branch_tests(self, node: ast.AST) -> dict[str, bool]:
        """The tests of the `if`s around `node` in its scope, each with the way taken to reach it (`if not X:`'s
        body is X taken False)."""
        tests: dict[str, bool] = {}
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef | ast.Module):
                break
            if isinstance(anc, ast.If) and child is not anc.test:
                test, taken = anc.test, any(child is stmt for stmt in anc.body)
                while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                    test, taken = test.operand, not taken
                tests.setdefault(ast.dump(test), taken)
            child = anc
        return tests

    def _encloses(self, binding: ast.AST, at: ast.AST) -> bool:
        """The binding's function holds `at` (a closure reading its enclosing function's name)."""
        fn = self.function_of(binding)
        return fn is not None and any(a is fn for a in self.ancestors(at))

    def _dominates(self, stmt: ast.AST, at: ast.AST) -> bool:
        """Every path to `at` runs `stmt` first: the statement's block holds `at` (or a statement holding it)."""
        parent = self.parent(stmt)
        if parent is None:
            return True
        child: ast.AST = at
        for anc in self.ancestors(at):
            if anc is parent:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    block = getattr(parent, field, None)
                    if isinstance(block, list) and stmt in block:
                        return child in block
                return True  # `x = (y := ...)` and other bindings that are not statements of a block
            child = anc
        return False

    def kind_of(self, expr: ast.AST | None, guess: bool = True) -> str | None:
        """A binding's kind, or with `guess` a kind read from the name (`train_loader`, `optimizer`)."""
        b = self.binding(expr)
        if b is not None:
            return b.kind
        if not guess:
            return None
        name = dotted(expr)
        return name_kind(name) if name is not None else None

    def is_model(self, expr: ast.AST | None) -> bool:
        """Whether an expression holds a module/model: a binding, `self` in a Module, or a model-like name."""
        if isinstance(expr, ast.Name) and expr.id == "self":
            info = self.class_of(expr)
            return bool(info and info.is_module)
        if isinstance(expr, ast.Subscript):
            container = element_container(expr)
            if container is expr:
                return False
            expr = container  # `self.model["generator"]`: an element of a dict of models
        b = self.binding(expr)
        if b is not None:
            return b.kind == "module"
        if isinstance(expr, ast.Name) and (expr.id in self.functions or expr.id in self.aliases
                                           and expr.id not in self._flag_values()):  # not `model = model.RNN(...)`
            # `eval_model(...)`, `build_model(...)`: a function of this file, or an imported one
            # (`from train.train_sbm import evaluate_network`), named like a model
            return False
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
            info = self.class_of(expr)
            if info is not None and info.method(expr.attr) is not None:
                return False  # `self.eval_model(...)`: a method of the class, not a model attribute
        name = dotted(expr)
        if name is not None and name.rsplit(".", 1)[-1].split("_", 1)[0].lower() in self.names["model_function_verbs"] \
                and "_" in name.rsplit(".", 1)[-1]:
            return False  # `self.unwrap_dist_model(...)` (a base class's method, LAVIS), `save_model`: a function
        if name is not None and self._foreign_model(name):
            return False
        return looks_like_model(name) or (isinstance(expr, ast.Name) and self._hands_out_parameters(expr))

    def _foreign_model(self, name: str) -> bool:
        """Every value this file assigns to `name` (anywhere) comes from another framework's call: fast-reid's
        `net = caffe.Net(model_def, weights, caffe.TEST)` is named like a model and is none of torch's."""
        roots = self.names["foreign_model_roots"]
        imported = self.__dict__.get("_imports_foreign")
        if imported is None:  # most files import no other framework: skip the table of assignments
            imported = self.__dict__["_imports_foreign"] = any(
                q.split(".", 1)[0] in roots for q in self.aliases.values())
        if not imported:
            return False
        values = self._flag_values().get(name)
        if not values:
            return False
        for value in values:
            q = self.resolve(value.func) if isinstance(value, ast.Call) else None
            if q is None or q.split(".", 1)[0] not in roots:
                return False
        return True

    def _hands_out_parameters(self, expr: ast.Name) -> bool:
        """Duck typing for a name bound to an instance of a class we cannot see (`classifier = PointNetCls(...)`,
        imported from another file): the file asks it for its parameters (`optim.SGD(classifier.parameters())`).
        Only the methods no optimizer, scheduler or trainer object answers; only names every assignment binds to
        a constructor call (not `netG = self._unwrap_net(...)`), and not to a plain class of this file (rtdl's
        `net_ensemble = DynamicNet(...)`, which gathers the parameters of its members)."""
        cache = self.__dict__.setdefault("_parameter_owners", None)
        if cache is None:
            cache = self.__dict__["_parameter_owners"] = {
                dotted(c.func.value) for m in ("parameters", "named_parameters")  # type: ignore[attr-defined]
                for c in self.method_calls(m) if not c.args and not c.keywords}
        if expr.id not in cache:
            return False
        values = [a.value for a in self.nodes(ast.Assign)  # any scope: a module-level instance used in a function
                  if any(isinstance(t, ast.Name) and t.id == expr.id for t in a.targets)]  # type: ignore[attr-defined]
        if not values:
            return False  # a parameter or a loop variable: who knows what it is
        for value in values:
            func = value.func if isinstance(value, ast.Call) else None
            while isinstance(func, ast.Attribute) and not (last_name(func) or "")[:1].isupper():
                func = func.value  # `DynamicNet.from_file(...)`: the class
            name = last_name(func) if isinstance(func, ast.Name | ast.Attribute) else None
            if not name or not name[:1].isupper():
                return False  # `netG = self._unwrap_net(...)`: not an instance built here
            if name in self.classes and not self.classes[name].is_module:
                return False
        return True

    def is_submodule(self, expr: ast.AST | None) -> bool:
        """`self.g` inside an nn.Module (or LightningModule) whose methods assign it a built object: a module
        binding, or a call of a capitalised class (`self.g = Generator(...)`, the class imported from another
        file of the project). What a module keeps under `self.` and calls is one of its parts."""
        if self.is_model(expr):
            return True
        name = dotted(expr)
        if name is not None and (_PART_NAME.search(name.rsplit(".", 1)[-1]) or self._used_as_module(name)):
            return True
        if not (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"):
            return False
        info = self.class_of(expr)
        if info is None or not info.is_module or info.method(expr.attr) is not None:
            return False
        for assign in self.self_assignments(info, None):
            if assign.attr != expr.attr or not isinstance(assign.value, ast.Call):
                continue
            b = self._classify(assign.value, f"self.{assign.attr}", assign.stmt)
            if b is not None:
                return b.kind == "module"
            if (last_name(assign.value.func) or "")[:1].isupper():
                return True
        return False

    def _used_as_module(self, name: str) -> bool:
        """Duck typing: somewhere in the file the name answers a module's own methods (`netD.parameters()`,
        `G.train()`, `critic.zero_grad()`, `D.state_dict()`)."""
        for method in _MODULE_METHODS:
            for call in self.method_calls(method):
                if dotted(call.func.value) == name:  # type: ignore[attr-defined]
                    return True
        return False

    def _sampler_named(self) -> bool:
        """Whether the file's text names a distributed sampler class at all. A name resolves to one only through
        the code's own spelling or an import of it, and a qualified name keeps its last part, so a file without
        `DistributedSampler` skips looking up what every locally named call may build."""
        if self._samplers_in_text is None:
            self._samplers_in_text = any(q.rsplit(".", 1)[-1] in self.source for q in self.names["distributed_samplers"])
        return self._samplers_in_text

    def _classify(self, value: ast.AST, name: str, stmt: ast.AST, depth: int = 0) -> Binding | None:
        if depth > 8:
            return None
        same = self.names["same_object_methods"]
        # `Net().to(device)`, `model.cuda()`: the same object as the receiver.
        while (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in same
            and (isinstance(value.func.value, ast.Call) or self.binding(value.func.value) is not None)
        ):
            value = value.func.value
        if isinstance(value, ast.IfExp):
            return self._classify(value.body, name, stmt, depth + 1) or self._classify(
                value.orelse, name, stmt, depth + 1
            )
        if isinstance(value, ast.Name | ast.Attribute):
            if isinstance(value, ast.Attribute) and value.attr in ("module", "_orig_mod"):
                inner = self.binding(value.value)
                if inner is not None and inner.kind == "module":
                    return Binding(name, "module", inner.cls, stmt, inner.call)
            source = self.binding(value)
            if source is not None:
                return Binding(name, source.kind, source.cls, stmt, source.call, source.wrapper, source.compiled, source.inner)
            return None
        if not isinstance(value, ast.Call):
            return None
        q = self.resolve(value.func)
        n = self.names
        if q is None:
            chosen = [c for c in self.class_choices(value.func) if c in self.names["distributed_samplers"]] \
                if self._sampler_named() else []
            if chosen:  # `train_sampler(dataset)`, a name for RandomSampler or DistributedSampler
                return Binding(name, "sampler", chosen[0], stmt, value)
            local = dotted(value.func)
            if local in self.classes and self.classes[local].is_module:
                return Binding(name, "module", local, stmt, value)
            if isinstance(value.func, ast.Name) and self.star_imports and self.project is not None \
                    and local not in self.classes and self.project.star_module_class(self.star_imports, local):
                # `from models import *` then `Generator()`
                return Binding(name, self._project_kind(local, name), local, stmt, value)
            returned = self._returned(value, name, stmt, depth)
            if returned is not None:
                return returned
            if isinstance(value.func, ast.Attribute) and value.func.attr == "from_pretrained":
                owner = last_name(value.func.value) or ""
                if any(marker in owner for marker in n["pretrained_model_markers"]):
                    return Binding(name, "module", dotted(value.func.value), stmt, value)
            return None
        if q in n["dataloaders"]:
            return Binding(name, "dataloader", q, stmt, value)
        if q in n["distributed_samplers"] or q in n["samplers"]:
            return Binding(name, "sampler", q, stmt, value)
        if q in n["scheduler_factories"] or any(q.startswith(p) for p in n["scheduler_prefixes"]):
            return Binding(name, "scheduler", q, stmt, value)
        if q in n["scalers"] or _SCALER_CLASS.search(q.rsplit(".", 1)[-1]):
            # timm's NativeScaler, MAE/ConvNeXt's NativeScalerWithGradNormCount: a GradScaler behind a call
            return Binding(name, "scaler", q, stmt, value)
        if q in n["autocast"]:
            return Binding(name, "autocast", q, stmt, value)
        if q in n["no_grad"] or q in n["set_grad_enabled"]:
            return Binding(name, "grad-mode", q, stmt, value)
        if q in n["ddp"] or q in n["fsdp"] or q in n["data_parallel"]:
            wrapper = "ddp" if q in n["ddp"] else "fsdp" if q in n["fsdp"] else "dp"
            inner_expr = kwarg(value, "module", 0)
            inner = self.binding(inner_expr)
            return Binding(name, "module", inner.cls if inner else None, stmt, value, wrapper, bool(inner and inner.compiled), dotted(inner_expr))
        if q in n["compile"]:
            inner_expr = kwarg(value, "model", 0)
            inner = self.binding(inner_expr)
            if inner is not None and inner.kind == "module":
                return Binding(name, "module", inner.cls, stmt, value, inner.wrapper, True, dotted(inner_expr))
            if inner is None and looks_like_model(dotted(inner_expr)):
                return Binding(name, "module", None, stmt, value, None, True, dotted(inner_expr))
            return None
        if q in n["optimizer_factories"]:
            return Binding(name, "optimizer", q, stmt, value)
        short = q.rsplit(".", 1)[-1]
        if short[:1].isupper() and q.count(".") == 2 and any(q.startswith(p) for p in n["optimizer_prefixes"]):
            return Binding(name, "optimizer", q, stmt, value)
        if q.startswith("torch.nn.") and short[:1].isupper() and q.count(".") == 2:
            if short.endswith(n["loss_module_suffix"]):
                return Binding(name, "loss", q, stmt, value)
            if short not in ("Parameter", "ParameterList", "ParameterDict", "Buffer"):
                return Binding(name, "module", q, stmt, value)
        if any(q.startswith(p) for p in n["model_factory_prefixes"]):
            return Binding(name, "module", q, stmt, value)
        if short == "from_pretrained":
            owner = q.rsplit(".", 2)[-2] if q.count(".") >= 1 else ""
            if any(marker in owner for marker in n["pretrained_model_markers"]):
                return Binding(name, "module", q.rsplit(".", 1)[0], stmt, value)
        if self.project is not None and self.project.is_module_class(q):
            # `network.coRNN(...)`: a module class of another file; `MultiBoxLoss(...)` is a loss, as in torch.nn
            return Binding(name, self._project_kind(short, name), q, stmt, value)
        returned = self.project.returned(q) if self.project is not None else None
        if returned is not None and len(returned) == 1 and returned[0] is not None:
            return self._factory_binding(name, returned[0], stmt)  # `model = build_model(cfg)` of another file
        return None

    def _factory_binding(self, name: str, made: tuple[str, str | None, str | None], stmt: ast.AST) -> Binding:
        """What a factory of another file returns (the pre-pass, projectcalls.py): kind, class and wrapper, and no
        call (its constructor's arguments are in the other file)."""
        kind, cls, wrapper = made
        # the pre-pass keeps the class as the other file spells it (`torch.utils.data.distributed.DistributedSampler`);
        # a binding's class is the public name everywhere else, which is what the vocabulary's lists hold
        cls = canonical(cls) if cls else cls
        if kind == "module":  # a project module class bound to `criterion` is a loss
            kind = self._project_kind(cls.rsplit(".", 1)[-1] if cls else "", name)
        return Binding(name, kind, cls, stmt, None, wrapper, guessed=True)

    def _bind_target(self, target: ast.AST, value: ast.AST | None, stmt: ast.AST) -> None:
        if value.__class__ in _HOLDS_NO_KIND and target.__class__ is not ast.Tuple and target.__class__ is not ast.List:
            return  # `n = 0`, `x = a + b`: most assignments of a file; nothing below can bind them
        if isinstance(value, ast.Call) and (framework := self.framework_call(value, "setup")):
            self._bind_setup(target, value, stmt, framework)
            return
        if isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    self._bind_target(t, v, stmt)
            elif isinstance(value, ast.Call) and self.project is not None and self.project.returns \
                    and (q := self.resolve(value.func)) is not None \
                    and (returned := self.project.returned(q)) is not None and len(returned) == len(target.elts):
                # `model, criterion, postprocessors = build_model(args)`: what a factory of another file returns
                for t, made in zip(target.elts, returned, strict=True):
                    if made is not None and (name := dotted(t)) is not None:
                        self._add(self._factory_binding(name, made, stmt))
            elif (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in self.names["pass_through_methods"]
                and len(handed := self._handed(value)) == len(target.elts)
            ):
                # accelerator.prepare(model, optimizer, loader) returns them in order, wrapped; so does
                # `backend.distribute(args=args, model=m, optimizer=o, training_data=dl, lr_scheduler=s)`.
                for t, v in zip(target.elts, handed, strict=True):
                    name = dotted(t)
                    inner = self._value_binding(v)
                    if name and inner is not None:
                        # A prepared loader moves its batches to the device itself: the wrapper says so.
                        wrapper = "accelerate" if inner.kind in ("module", "dataloader") else inner.wrapper
                        self._add(Binding(name, inner.kind, inner.cls, stmt, inner.call, wrapper, inner.compiled, dotted(v)))
                    elif name and value.func.attr == "prepare" and self._prepared_module(name, v):
                        self._add(Binding(name, "module", None, stmt, None, "accelerate", False, dotted(v)))
            return
        name = dotted(target) or keyed_name(target)
        if name is None or value is None:
            return
        if isinstance(value, ast.Dict):
            # `data_loader = {"train": DataLoader(...), "dev": DataLoader(...)}`: each entry is bound under
            # `data_loader['train']`, which `self.data_loader["train"]` finds after the dict is handed on.
            for key, item in zip(value.keys, value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str | int):
                    entry = self._classify(item, f"{name}[{key.value!r}]", stmt)
                    if entry is not None:
                        self._add(entry)
            return
        self._copy_entries(value, name, stmt)
        b = self._classify(value, name, stmt)
        if (
            b is None
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in self.names["pass_through_methods"]
        ):
            # `accelerator.prepare(loader)`, `distr_backend.distribute(training_data=dl)`: what comes back is
            # the one training object handed in, wrapped.
            handed = [a for a in [*value.args, *(k.value for k in value.keywords)] if self.binding(a) is not None]
            inner = self.binding(handed[0]) if len(handed) == 1 else None
            if inner is not None:
                prepared = value.func.attr == "prepare" and inner.kind in ("module", "dataloader")
                b = Binding(name, inner.kind, inner.cls, stmt, inner.call, "accelerate" if prepared else inner.wrapper,
                            inner.compiled, dotted(handed[0]))
        if b is None and isinstance(value, ast.Subscript):
            b = self._prepared_item(value, name, stmt)
        if b is not None:
            self._add(b)

    def _prepared_module(self, name: str, handed: ast.AST) -> bool:
        """What `accelerator.prepare` handed back is a model when nothing of this file built it but it is used as
        one (`vae.state_dict()`, `self.model.train()`) or named as one, and is named as no optimizer or loader."""
        handed_name = dotted(handed) or ""
        names = (name, handed_name)
        if any(_OPTIMIZER_NAME.search(n.rsplit(".", 1)[-1]) or looks_like_loader(n) for n in names if n):
            return False
        return any(looks_like_model(n) or self._used_as_module(n) for n in names if n)

    def _prepared_item(self, value: ast.Subscript, name: str, stmt: ast.AST) -> Binding | None:
        """`vae = prepared[0]` after `prepared = accelerator.prepare(vae, loader, *optimizers)`: the item handed in
        at that position, wrapped (only positions before any starred argument are known)."""
        source, index = dotted(value.value), value.slice
        if source is None or not (isinstance(index, ast.Constant) and isinstance(index.value, int)):
            return None
        if self._prepared_names is None:  # names bound to a whole `x.prepare(...)` result, found once per file
            self._prepared_names = {}
            for assign in self.nodes(ast.Assign):
                call = assign.value  # type: ignore[attr-defined]
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "prepare":
                    for t in assign.targets:  # type: ignore[attr-defined]
                        if (held := dotted(t)) is not None:
                            self._prepared_names.setdefault(held, []).append(call)
        for call in self._prepared_names.get(source, []):
            if index.value >= len(call.args) or any(isinstance(a, ast.Starred) for a in call.args[: index.value + 1]):
                return None
            v = call.args[index.value]
            inner = self._value_binding(v)
            if inner is not None:
                wrapper = "accelerate" if inner.kind in ("module", "dataloader") else inner.wrapper
                return Binding(name, inner.kind, inner.cls, stmt, inner.call, wrapper, inner.compiled, dotted(v))
            if self._prepared_module(name, v):
                return Binding(name, "module", None, stmt, None, "accelerate", False, dotted(v))
        return None

    def _bind_setup(self, target: ast.AST, call: ast.Call, stmt: ast.AST, framework: str) -> None:
        """`model, optimizer = fabric.setup(model, optimizer)`: the framework hands back what it was given, in the
        kinds its contract names (vocabulary.toml `setup_returns`: the model, then optimizers), wrapped."""
        targets = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
        kinds = self.framework_facts(framework)["setup_returns"]
        for i, (t, v) in enumerate(zip(targets, call.args, strict=False)):
            name = dotted(t)
            if name is None:
                continue
            inner = self._value_binding(v)
            kind = kinds[min(i, len(kinds) - 1)]
            self._add(Binding(name, kind, inner.cls if inner else None, stmt, inner.call if inner else None,
                              framework if kind == "module" else (inner.wrapper if inner else None),
                              bool(inner and inner.compiled), dotted(v)))

    def _add(self, b: Binding) -> None:
        self.bindings.setdefault(b.name, []).append(b)
        if b.name.endswith("]"):
            base, _, key = b.name.partition("[")
            self._entries.setdefault(base, set()).add("[" + key)

    def _copy_entries(self, value: ast.AST, name: str, stmt: ast.AST) -> None:
        """`self.data_loader = data_loader`: the keyed entries of a container travel with it."""
        source = dotted(value) if isinstance(value, ast.Name | ast.Attribute) else None
        keys = self._entries.get(source) if source is not None else None
        if not keys:
            return
        for key in sorted(keys):
            copied = name + key
            b = self.bindings[source + key][-1]
            if copied not in self.bindings:
                self._add(Binding(copied, b.kind, b.cls, stmt, b.call, b.wrapper, b.compiled, b.inner, b.guessed))

    def _late_copies(self) -> None:
        """A copy written before its source is bound in the file (`self.loader = loader` in `__init__`, with
        `loader = DataLoader(...)` further down in `main`, or a parameter bound from its call sites): once every
        binding is known, plain copies take the kind (and keyed entries) of what they copy."""
        assigns = [a for a in self.assignments_in_order() if a.__class__ is ast.Assign]  # type: ignore[attr-defined]
        unwrapped = {(dotted(t), dotted(a.value.value)) for a in assigns for t in a.targets  # type: ignore[attr-defined]
                     if isinstance(a.value, ast.Attribute) and a.value.attr == "module"}  # type: ignore[attr-defined]
        for stmt in assigns:
            value = stmt.value
            if not isinstance(value, ast.Name | ast.Attribute):
                continue
            for target in stmt.targets:
                name = dotted(target)
                if name is None:
                    continue
                self._copy_entries(value, name, stmt)
                if name not in self.bindings:
                    source = self.binding(value)
                    if source is not None and source.name != name:
                        # `g_module = generator.module` in one branch, `g_module = generator` in the other (the
                        # model is wrapped only when distributed): the name holds the plain model either way
                        wrapper = None if (name, dotted(value)) in unwrapped else source.wrapper
                        self._add(Binding(name, source.kind, source.cls, stmt, source.call, wrapper,
                                          source.compiled, source.inner, source.guessed))

    def _bind_from_use(self) -> None:
        """Kinds from use, for a scheduler no constructor of this file shows: `optimizer, scheduler =
        train_model.get_optimizer(...)` (lightly-train), a parameter, `self.lr_scheduler` built in another module.
        A name with no kind whose `.step()` runs right after an optimizer step in the same block, or that answers
        `get_last_lr()`, is a learning-rate scheduler when nothing calls `zero_grad()` on it and its name says
        nothing else (a loader, a scaler, an optimizer, a model). `env.step(action)` takes an argument and has no
        optimizer step before it."""
        stepped: dict[str, list[ast.Call]] = {}
        for call in self.method_calls("step"):
            name = dotted(call.func.value)  # type: ignore[attr-defined]
            if name is None or name in self.bindings or call.keywords or len(call.args) > 1:
                continue
            stepped.setdefault(name, []).append(call)
        if not stepped:
            return
        zeroed = {dotted(c.func.value) for c in self.method_calls("zero_grad")}  # type: ignore[attr-defined]
        reads_lr = {dotted(c.func.value) for c in self.method_calls("get_last_lr")}  # type: ignore[attr-defined]
        for name, calls in stepped.items():
            short = name.rsplit(".", 1)[-1]
            if name in zeroed or looks_like_loader(short) or looks_like_model(short) \
                    or _SCALER_NAME.search(short) or _OPTIMIZER_NAME.search(short):
                continue
            if name not in reads_lr and not any(not c.args and self._after_optimizer_step(c) for c in calls):
                continue
            self._add(Binding(name, "scheduler", None, self._bound_at(name, calls[0]), None, guessed=True))

    def _after_optimizer_step(self, call: ast.Call) -> bool:
        """An optimizer step in a statement before this call's statement, in the same block."""
        stmt = self.statement_of(call)
        parent = self.parent(stmt) if stmt is not None else None
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and stmt in block:
                before = block[:block.index(stmt)]
                return any(isinstance(n, ast.Call) and self.is_optimizer_step(n) for s in before for n in subtree(s))
        return False

    def _bound_at(self, name: str, fallback: ast.AST) -> ast.AST:
        """The statement that binds a name (a tuple assignment, a `self.x = ...`), else the function it is a
        parameter of, else the statement of its first use."""
        for stmt in self.nodes(ast.Assign):
            for target in stmt.targets:  # type: ignore[attr-defined]
                if any(dotted(t) == name for t in subtree(target) if isinstance(t, ast.Name | ast.Attribute)):
                    return stmt
        fn = self.function_of(fallback)
        if fn is not None and name in {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}:
            return fn
        return self.statement_of(fallback) or fallback

    def _handed(self, call: ast.Call) -> list[ast.expr]:
        """The arguments of a pass-through call, in order: all positional ones when there are any (prepare's
        contract), else the keyword values that hold a training object or sit in a training object's slot
        (`model=`, `training_data=`: DeepSpeed's distribute returns them in that order)."""
        if call.args:
            return list(call.args)
        slots = self.names["pass_through_keywords"]
        return [k.value for k in call.keywords
                if k.arg is not None and (k.arg in slots or self._value_binding(k.value) is not None)]

    def _value_binding(self, expr: ast.AST) -> Binding | None:
        """A name's binding, also through `ds if deepspeed else dl` (either branch that holds one)."""
        if isinstance(expr, ast.IfExp):
            return self._value_binding(expr.body) or self._value_binding(expr.orelse)
        return self.binding(expr)

    def returns_of(self, fn: ast.AST) -> list[ast.expr]:
        """The values a function of this file returns (`return x` statements of its own body)."""
        if not self._returns_of:  # every function's return values at once, from the engine's one walk
            for r in self.nodes(ast.Return):
                if r.value is not None:  # type: ignore[attr-defined]
                    self._returns_of.setdefault(self.function_of(r), []).append(r.value)  # type: ignore[attr-defined]
            self._returns_of.setdefault(None, [])  # built, even for a file without returns
        return self._returns_of.get(fn, [])

    def _returned(self, call: ast.Call, name: str, stmt: ast.AST, depth: int) -> Binding | None:
        """Kinds follow return values: `self.train_loader = self._prepare_dataloader(ds)` holds what every
        `return` of that function or method of the file builds (`return DataLoader(ds, sampler=...)`)."""
        func = call.func
        target = None
        if isinstance(func, ast.Name):
            target = self.functions.get(func.id)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            info = self.class_of(call)
            target = info.method(func.attr) if info is not None else None
        if target is None or depth > 4:
            return None
        returns = self.returns_of(target)
        found = [self._classify(value, name, stmt, depth + 1) for value in returns]
        if not found or any(b is None for b in found) or len({b.kind for b in found if b is not None}) != 1:
            return None
        return found[-1]

    def _bind_parameters(self) -> None:
        """Kinds follow function parameters: `train_gan(..., scheduler=self.scheduler)` makes the parameter
        `scheduler` of `train_gan` a scheduler when every call in the file that passes it passes the same kind.
        A parameter that has a binding of its own (or none passed) stays as it is."""
        # A parameter whose default builds the object (`def __init__(self, loss=nn.CrossEntropyLoss())`) holds
        # that kind unless a caller says otherwise.
        for fn in self.nodes(ast.FunctionDef) + self.nodes(ast.AsyncFunctionDef):
            args = fn.args.posonlyargs + fn.args.args  # type: ignore[attr-defined]
            defaults = fn.args.defaults  # type: ignore[attr-defined]
            pairs = list(zip(args[len(args) - len(defaults):], defaults, strict=True))
            pairs += [(a, d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d is not None]  # type: ignore[attr-defined]
            for arg, default in pairs:
                if isinstance(default, ast.Call) and (last_name(default.func) or "")[:1].isupper() \
                        and arg.arg not in self.bindings:  # a constructor: `nn.CrossEntropyLoss()`
                    b = self._classify(default, arg.arg, fn)
                    if b is not None:
                        b.guessed = True
                        self._add(b)
        self._bind_annotations()
        self._bind_handed()
        constructors = self._constructor_calls()
        built = {id(call) for call, _ in constructors}
        named: dict[str, set[str]] = {}  # parameter -> kinds the names of values handed in without a binding say
        for call, fn in self._local_function_calls() + constructors:
            params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            bound = isinstance(call.func, ast.Attribute) or id(call) in built  # `self.m(...)`, `Trainer(...)`
            offset = 1 if params and params[0] in ("self", "cls") and bound else 0
            passed = [(params[i + offset], a) for i, a in enumerate(call.args)
                      if i + offset < len(params) and not isinstance(a, ast.Starred)]
            passed += [(kw.arg, kw.value) for kw in call.keywords if kw.arg in params]
            for name, arg in passed:
                # An object built in the call itself (`fit(net, DataLoader(ds, sampler=s), StepLR(opt, 30))`) is
                # handed in as surely as a named one, with its constructor's arguments.
                source = self._classify(arg, name, fn) if isinstance(arg, ast.Call) else self.binding(arg)
                if source is None:
                    # A value whose name says a kind (`train_one(loader, net)` into `def train_one(net, loader)`):
                    # the parameter's name is file-wide, so a model bound to `net` by another function's callers
                    # would be read into this one. Kept to compare once every caller is seen.
                    said = self.kind_of(arg) if isinstance(arg, ast.Name | ast.Attribute) else None
                    if said is not None:
                        named.setdefault(name, set()).add(said)
                    continue
                if name in self.bindings and self.bindings[name][-1].node is not fn:
                    continue
                known = self.bindings.get(name)
                if known and known[-1].kind != source.kind:
                    self.bindings.pop(name)  # callers disagree: the parameter's kind is unknown
                    continue
                if not known:
                    self._add(Binding(name, source.kind, source.cls, fn, source.call, source.wrapper, source.compiled,
                                      source.inner, guessed=True))
        for name, kinds in named.items():  # callers disagree, by a binding and by a name: the kind is unknown
            known = self.bindings.get(name)
            if known and isinstance(known[-1].node, ast.FunctionDef | ast.AsyncFunctionDef) and known[-1].guessed \
                    and kinds - {known[-1].kind}:
                self.bindings.pop(name)

    def _bind_annotations(self) -> None:
        """Kinds from parameter annotations: `def train_one_epoch(model: torch.nn.Module, data_loader: DataLoader,
        optimizer: torch.optim.Optimizer)` says what the callers (often in another file) hand in. No arguments are
        known: the binding has no call, so no rule reads a constructor's defaults into it."""
        # The kind by the annotation's spelling, once per file: a file annotates hundreds of parameters with a few
        # types (`Tensor`, `int`, `Optional[Tensor]`), and what a spelling resolves to and builds is the same at
        # every one of them (the imports are final once the index is built).
        kinds: dict[str, tuple[str | None, str | None]] = {}
        for fn in self.nodes(ast.FunctionDef) + self.nodes(ast.AsyncFunctionDef):
            args = fn.args  # type: ignore[attr-defined]
            for arg in args.posonlyargs + args.args + args.kwonlyargs:
                if arg.annotation is None or arg.arg in self.bindings:
                    continue
                ann = arg.annotation
                if isinstance(ann, ast.Subscript) and (last_name(ann.value) or "") == "Optional":
                    ann = ann.slice
                elif isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
                    ann = ann.left  # `DataLoader | None`
                if not isinstance(ann, ast.Name | ast.Attribute):
                    continue
                spelled = dotted(ann)
                known = kinds.get(spelled) if spelled is not None else None
                if known is None:
                    q = self.resolve(ann)
                    known = (q, self._class_kind(q) if q is not None else None)
                    if spelled is not None:
                        kinds[spelled] = known
                q, kind = known
                if kind is not None:
                    if kind == "module":  # `criterion: torch.nn.Module` (DETR's train_one_epoch) is a loss
                        kind = self._project_kind(q.rsplit(".", 1)[-1], arg.arg)
                    self._add(Binding(arg.arg, kind, q, fn, None, guessed=True))

    def _bind_handed(self) -> None:
        """Kinds from callers in other files (the pre-pass, projectcalls.py): `train(model, loader, optimizer)` in
        `train.py` says what `def train(net, data, opt)` of this file receives. Module-level functions and the
        constructors of module-level classes only; a parameter this file binds otherwise keeps its own binding.
        No arguments are known: the binding has no call, so no rule reads a constructor's defaults into it."""
        if self.project is None or not self.module or not self.project.handed.get(self.module):
            return
        for fn in self.nodes(ast.FunctionDef) + self.nodes(ast.AsyncFunctionDef):
            parent = self.parent(fn)
            if isinstance(parent, ast.Module):
                owner = fn.name  # type: ignore[attr-defined]
            elif isinstance(parent, ast.ClassDef) and fn.name == "__init__" \
                    and isinstance(self.parent(parent), ast.Module):  # type: ignore[attr-defined]
                owner = parent.name
            else:
                continue
            for param, (kind, cls, wrapper) in self.project.handed_to(self.module, owner).items():
                if param in self.bindings or self._stored_outside(param, fn):
                    continue
                if kind == "module":  # a project module class handed to `criterion` is a loss
                    kind = self._project_kind(cls.rsplit(".", 1)[-1] if cls else "", param)
                self._add(Binding(param, kind, cls, fn, None, wrapper, guessed=True))

    def _stored_outside(self, name: str, fn: ast.AST) -> bool:
        """Whether another function or the module assigns `name` too. Names are file-wide in the index, so a kind
        handed to `def __init__(self, model)` would be read into `model = package['model']` (a dict) of a sibling
        method; a name the file gives other values elsewhere keeps no handed kind."""
        return any(node.id == name and isinstance(node.ctx, ast.Store) and self.function_of(node) is not fn
                   for node in self.nodes(ast.Name))

    def _class_kind(self, q: str) -> str | None:
        """The kind of object a qualified class name builds, for an annotation (no call to read)."""
        return class_kind(q, self.names, self.project)

    def _project_kind(self, short: str, name: str) -> str:
        """A module class of the project builds a loss when its name or the name it is bound to says so
        (`MultiBoxLoss`, `criterionKD = DML(...)`), else a model."""
        held = name.rsplit(".", 1)[-1].lower()
        if short.endswith(self.names["loss_module_suffix"]) or "criterion" in held or held.endswith(_LOSS_ENDS):
            return "loss"
        return "module"

    def _constructor_calls(self) -> list[tuple[ast.Call, ast.AST]]:
        """(call, __init__) for `Trainer(model=..., data_loader=...)` of a class of this file."""
        out: list[tuple[ast.Call, ast.AST]] = []
        if not self.classes:
            return out
        # The calls filed under a class's own name (a plain name resolves to itself), in the walk's order; every
        # call only when an import shares a class's name and files its calls under the import.
        shared = self.classes.keys() & (self.aliases.keys() | self.vocab["conventional_aliases"].keys())
        for call in self.nodes(ast.Call) if shared else self.calls_named(frozenset(self.classes), frozenset()):
            func = call.func
            if isinstance(func, ast.Name) and func.id in self.classes:
                init = self.classes[func.id].method("__init__")
                if init is not None:
                    out.append((call, init))
        return out

    def _build_bindings(self) -> None:
        """Every assignment in source order, so a name's latest binding wins."""
        for stmt in self.assignments_in_order():  # type: ignore[attr-defined]
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    self._bind_target(target, stmt.value, stmt)
            else:
                self._bind_target(stmt.target, stmt.value, stmt)
        # fully_shard(model) wraps in place (FSDP2).
        for call in self.calls_to(*sorted(self.names["fsdp"])):
            inner = kwarg(call, "module", 0)
            b = self.binding(inner)
            if b is not None and isinstance(self.parents.get(call), ast.Expr):
                self._add(Binding(b.name, b.kind, b.cls, call, b.call, "fsdp", b.compiled, b.name))

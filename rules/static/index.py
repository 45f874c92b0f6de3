"""The semantic index: what a training script is made of, built once per file.

The engine walks the tree once (engine.walk); that walk records every node's
parent and collects the node types the index and the rules asked for. The
index then answers, for every rule, the questions a grep cannot:

- names: `resolve(expr)` turns `F.cross_entropy`, `nn.Linear` or
  `ac` (from `from torch.cuda.amp import autocast as ac`) into qualified
  names (`torch.nn.functional.cross_entropy`, ...), re-exports canonicalised;
- bindings: which names hold a DataLoader (with its keyword arguments), a
  sampler, a scheduler, an optimizer, a GradScaler, an autocast context, a
  module (a model, and whether it is DDP/FSDP-wrapped or compiled) or a loss;
- loops: the batch (step) loop vs the epoch loop, training loops (they call
  `backward()` or `optimizer.step()`, directly or through a function of the
  file) vs validation loops;
- classes: `nn.Module` subclasses (through aliases and bases defined in the
  same file) with their `__init__`/`forward` and `self.x = ...` assignments;
  `torch.autograd.Function` subclasses;
- regions: grad disabled (`torch.no_grad()`, `inference_mode()`, decorators,
  callers), autocast (with its dtype), rank guards (`if rank == 0`,
  `is_main_process()`, `accelerator.is_main_process`, early returns, ...);
- contexts for the router: distributed, amp, compile, gpu, custom-autograd.

Names are file-global (a script rarely reuses `loader` for two kinds of
object); `self.x` attributes are keyed as "self.x".
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
WITHS = (ast.With, ast.AsyncWith)

# The node types the index itself needs from the walk.
INDEX_NODES: tuple[type[ast.AST], ...] = (
    ast.Import,
    ast.ImportFrom,
    ast.Assign,
    ast.AnnAssign,
    ast.ClassDef,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.Call,
)


@cache
def vocabulary() -> dict[str, Any]:
    import tomllib

    with open(Path(__file__).with_name("vocabulary.toml"), "rb") as fh:
        data = tomllib.load(fh)
    names = data["names"]
    for key, value in list(names.items()):
        if isinstance(value, list):
            names[key] = frozenset(value)
    rank = data["rank"]
    for key, value in list(rank.items()):
        rank[key] = frozenset(value)
    data["canonical_prefixes"] = sorted(data["canonical_prefixes"].items(), key=lambda kv: -len(kv[0]))
    return data


def dotted(expr: ast.AST | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    cls = expr.__class__
    if cls is ast.Name:
        return expr.id  # type: ignore[union-attr]
    if cls is not ast.Attribute:
        return None
    value = expr.value  # type: ignore[union-attr]
    if value.__class__ is ast.Name:  # the common `F.softmax`, `self.fc`
        return f"{value.id}.{expr.attr}"  # type: ignore[union-attr]
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
        return ".".join(reversed(parts))
    return None


def last_name(expr: ast.AST | None) -> str | None:
    """The last component of a name, attribute or call: `self.model` -> model, `f()` -> f."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return None


def kwarg(call: ast.Call, name: str, position: int | None = None) -> ast.expr | None:
    """A call's argument by keyword, or by position when given."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if position is not None and len(call.args) > position:
        arg = call.args[position]
        if not isinstance(arg, ast.Starred) and not any(isinstance(a, ast.Starred) for a in call.args[:position]):
            return arg
    return None


def is_constant(expr: ast.AST | None, value: Any) -> bool:
    return isinstance(expr, ast.Constant) and type(expr.value) is type(value) and expr.value == value


@cache
def canonical(name: str) -> str:
    """Re-exported and private paths -> the public name (`torch.nn.modules.linear.Linear` -> `torch.nn.Linear`)."""
    for prefix, replacement in vocabulary()["canonical_prefixes"]:
        if name.startswith(prefix):
            name = replacement + name[len(prefix) :]
            break
    parts = name.split(".")
    if len(parts) >= 4 and parts[:3] == ["torch", "nn", "modules"]:
        return "torch.nn." + parts[-1]
    if len(parts) == 3 and parts[:2] == ["torch", "nn"] and parts[2] == "modules":
        return name
    if len(parts) == 4 and parts[:2] == ["torch", "optim"] and parts[2] not in ("lr_scheduler", "swa_utils"):
        return "torch.optim." + parts[3]
    return name


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


@dataclass
class ClassInfo:
    node: ast.ClassDef
    bases: list[str]
    is_module: bool = False
    is_function: bool = False  # a torch.autograd.Function subclass

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def methods(self) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        return {s.name: s for s in self.node.body if isinstance(s, FUNCTIONS)}

    def method(self, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        return self.methods.get(name)


@dataclass
class SelfAssign:
    attr: str
    value: ast.expr
    stmt: ast.stmt
    method: ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Loop:
    node: ast.For | ast.AsyncFor | ast.While
    scope: ast.AST
    parent: Loop | None
    targets: tuple[str, ...]
    source: str | None  # dotted name iterated, after unwrapping enumerate/tqdm/zip
    source_binding: Binding | None
    iterates_loader: bool
    has_backward: bool = False  # a backward() directly in this loop (not in a nested loop)
    has_step: bool = False  # an optimizer step directly in this loop
    calls_training: bool = False  # calls a function of this file that trains
    trains: bool = False  # any of the above here or in a nested loop
    children: list[Loop] = field(default_factory=list)
    calls: list[ast.Call] = field(default_factory=list)  # calls directly in this loop, in source order
    kind: str = "other"  # batch | epoch | other
    validation: bool = False

    def all_calls(self) -> Iterator[ast.Call]:
        yield from self.calls
        for child in self.children:
            yield from child.all_calls()

    @property
    def line(self) -> int:
        return self.node.lineno


@dataclass
class AutocastRegion:
    node: ast.AST  # the With statement or the decorated function
    call: ast.Call | None
    device: str | None  # "cuda" | "cpu" | None (unknown)
    dtype: str | None  # "float16" | "bfloat16" | None (unknown)


_MODEL_NAME = re.compile(r"(?:^|_)(?:model|net|network|backbone)s?$|model$", re.I)
_LOADER_NAME = re.compile(r"loader|(?:^|_)dl$|^dl_", re.I)
_EVAL_WORD = re.compile(
    r"(?:^|[^a-z])(?:val|valid|validation|validate|test|testing|eval|evaluate|evaluation|dev|holdout|predict|"
    r"prediction|inference|infer)(?:[^a-z]|loader|dl|set|data|ds|$)"
)
_OPTIMIZER_NAME = re.compile(r"(?:^|_)(?:optim|optimizer|optimiser|opt)s?(?:_|$)|optimizer", re.I)
_SCALER_NAME = re.compile(r"scaler$", re.I)


def looks_like_model(name: str | None) -> bool:
    return bool(name) and bool(_MODEL_NAME.search(name.rsplit(".", 1)[-1]))


def looks_like_loader(name: str | None) -> bool:
    return bool(name) and bool(_LOADER_NAME.search(name.rsplit(".", 1)[-1]))


def is_eval_word(name: str | None) -> bool:
    return bool(name) and bool(_EVAL_WORD.search(name.lower()))


class Index:
    def __init__(
        self,
        tree: ast.Module,
        buckets: dict[type, list[ast.AST]],
        parents: dict[ast.AST, ast.AST],
        source: str = "",
    ):
        self.tree = tree
        self.buckets = buckets
        self.parents = parents
        self.source = source
        self.vocab = vocabulary()
        self.names = self.vocab["names"]
        self.aliases: dict[str, str] = {}
        self.star_imports: list[str] = []
        self.imported: set[str] = set()  # qualified module/object names imported
        self.bindings: dict[str, list[Binding]] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}  # module-level functions
        self.loops: dict[ast.AST, Loop] = {}
        self.calls_by_name: dict[str, list[ast.Call]] = {}
        self.calls_by_method: dict[str, list[ast.Call]] = {}
        self._callee: dict[ast.Call, str | None] = {}
        self._scope: dict[ast.AST, ast.AST] = {}
        self._loop_of: dict[ast.AST, Loop | None] = {}
        self._defs: dict[ast.AST, dict[str, list[tuple[ast.stmt, ast.expr]]]] | None = None
        self._self_assigns: dict[ast.ClassDef, list[SelfAssign]] | None = None
        self._callers: dict[ast.AST, list[ast.Call]] | None = None
        self._local_calls: list[tuple[ast.Call, ast.AST]] | None = None
        self.training_functions: set[ast.AST] = set()
        self.backward_calls: list[ast.Call] = []
        self.step_calls: list[ast.Call] = []
        self._build()

    # -- nodes -------------------------------------------------------------------------------

    def nodes(self, kind: type[ast.AST]) -> list[ast.AST]:
        return self.buckets.get(kind, [])

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        parent = self.parents.get(node)
        while parent is not None:
            yield parent
            parent = self.parents.get(parent)

    def enclosing(self, node: ast.AST, kinds: type | tuple[type, ...]) -> ast.AST | None:
        for anc in self.ancestors(node):
            if isinstance(anc, kinds):
                return anc
        return None

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The innermost function, lambda, class body or module holding `node`."""
        path: list[ast.AST] = []
        current = self.parents.get(node)
        result: ast.AST = self.tree
        while current is not None:
            cached = self._scope.get(current)
            if cached is not None:
                result = cached
                break
            if isinstance(current, SCOPES):
                result = current
                break
            path.append(current)
            current = self.parents.get(current)
        for p in path:
            self._scope[p] = result
        return result

    def function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        scope = self.scope_of(node)
        while isinstance(scope, ast.Lambda):
            scope = self.scope_of(scope)
        return scope if isinstance(scope, FUNCTIONS) else None

    def class_of(self, node: ast.AST) -> ClassInfo | None:
        """The class whose method holds `node`."""
        fn = self.function_of(node)
        while fn is not None:
            owner = self.parents.get(fn)
            if isinstance(owner, ast.ClassDef):
                info = self.classes.get(owner.name)
                return info if info is not None and info.node is owner else ClassInfo(owner, [])
            fn = self.function_of(fn)
        return None

    def statement_of(self, node: ast.AST) -> ast.stmt | None:
        current: ast.AST | None = node
        while current is not None and not isinstance(current, ast.stmt):
            current = self.parents.get(current)
        return current

    # -- names -------------------------------------------------------------------------------

    def resolve(self, expr: ast.AST | None) -> str | None:
        """The qualified name of an imported object: `F.softmax` -> `torch.nn.functional.softmax`."""
        name = dotted(expr)
        if name is None:
            return None
        root, _, rest = name.partition(".")
        base = self.aliases.get(root)
        if base is None:
            base = self.vocab["conventional_aliases"].get(root)
            if base is None:
                return None
        return canonical(f"{base}.{rest}" if rest else base)

    def callee(self, call: ast.Call) -> str | None:
        """The qualified name of what a call calls; the plain dotted name for local objects."""
        try:
            return self._callee[call]
        except KeyError:
            pass
        name = self.resolve(call.func)
        if name is None:
            name = dotted(call.func)
        self._callee[call] = name
        return name

    def calls_to(self, *names: str) -> list[ast.Call]:
        """Calls of any of these qualified names, in source order."""
        found: list[ast.Call] = []
        for n in names:
            found += self.calls_by_name.get(n, [])
        return sorted(found, key=_position) if len(names) > 1 else found

    def method_calls(self, method: str) -> list[ast.Call]:
        """Every `<expr>.method(...)` call, in source order."""
        return self.calls_by_method.get(method, [])

    def uses(self, prefix: str) -> bool:
        """Whether the file imports or calls anything under a qualified prefix."""
        dotted_prefix = prefix + "."
        return any(n == prefix or n.startswith(dotted_prefix) for n in self.imported) or any(
            n == prefix or n.startswith(dotted_prefix) for n in self.calls_by_name
        )

    # -- bindings ----------------------------------------------------------------------------

    def binding(self, expr: ast.AST | str | None) -> Binding | None:
        """The latest binding of a name (or Name/Attribute node) whose kind is known."""
        name = expr if isinstance(expr, str) else dotted(expr)
        if name is None:
            return None
        found = self.bindings.get(name)
        return found[-1] if found else None

    def bindings_of(self, kind: str) -> list[Binding]:
        return [b for bs in self.bindings.values() for b in bs if b.kind == kind]

    def kind_of(self, expr: ast.AST | None, guess: bool = True) -> str | None:
        """A binding's kind, or with `guess` a kind read from the name (`train_loader`, `optimizer`)."""
        b = self.binding(expr)
        if b is not None:
            return b.kind
        if not guess:
            return None
        name = dotted(expr)
        if name is None:
            return None
        if looks_like_loader(name):
            return "dataloader"
        if _SCALER_NAME.search(name.rsplit(".", 1)[-1]):
            return "scaler"
        if _OPTIMIZER_NAME.search(name.rsplit(".", 1)[-1]):
            return "optimizer"
        if looks_like_model(name):
            return "module"
        return None

    def is_model(self, expr: ast.AST | None) -> bool:
        """Whether an expression holds a module/model: a binding, `self` in a Module, or a model-like name."""
        if isinstance(expr, ast.Name) and expr.id == "self":
            info = self.class_of(expr)
            return bool(info and info.is_module)
        b = self.binding(expr)
        if b is not None:
            return b.kind == "module"
        return looks_like_model(dotted(expr))

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
            local = dotted(value.func)
            if local in self.classes and self.classes[local].is_module:
                return Binding(name, "module", local, stmt, value)
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
        if q in n["scalers"]:
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
        return None

    def _bind_target(self, target: ast.AST, value: ast.AST | None, stmt: ast.AST) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    self._bind_target(t, v, stmt)
            elif (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr == "prepare"
                and len(value.args) == len(target.elts)
            ):
                # accelerator.prepare(model, optimizer, loader) returns them in order, wrapped.
                for t, v in zip(target.elts, value.args, strict=True):
                    name = dotted(t)
                    inner = self.binding(v)
                    if name and inner is not None:
                        # A prepared loader moves its batches to the device itself: the wrapper says so.
                        wrapper = "accelerate" if inner.kind in ("module", "dataloader") else inner.wrapper
                        self._add(Binding(name, inner.kind, inner.cls, stmt, inner.call, wrapper, inner.compiled, dotted(v)))
            return
        name = dotted(target)
        if name is None or value is None:
            return
        b = self._classify(value, name, stmt)
        if (
            b is None
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr == "prepare"
            and len(value.args) == 1
        ):
            inner = self.binding(value.args[0])
            if inner is not None:
                b = Binding(name, inner.kind, inner.cls, stmt, inner.call,
                            "accelerate" if inner.kind in ("module", "dataloader") else None, inner.compiled,
                            dotted(value.args[0]))
        if b is not None:
            self._add(b)

    def _add(self, b: Binding) -> None:
        self.bindings.setdefault(b.name, []).append(b)

    # -- build -------------------------------------------------------------------------------

    def _build(self) -> None:
        for node in self.nodes(ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    root = alias.name.split(".", 1)[0]
                    self.aliases[root] = root
                self.imported.add(alias.name)
        for node in self.nodes(ast.ImportFrom):
            module = ("." * node.level) + (node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    self.star_imports.append(module)
                    continue
                full = f"{module}.{alias.name}" if module else alias.name
                self.aliases[alias.asname or alias.name] = full
                self.imported.add(canonical(full) if not node.level else full)

        for node in self.nodes(ast.FunctionDef) + self.nodes(ast.AsyncFunctionDef):
            if isinstance(self.parents.get(node), ast.Module):
                self.functions[node.name] = node
        self._build_classes()

        for node in self.nodes(ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                self.calls_by_method.setdefault(func.attr, []).append(node)
            name = self.callee(node)
            if name is not None:
                self.calls_by_name.setdefault(name, []).append(node)

        statements = self.nodes(ast.Assign) + self.nodes(ast.AnnAssign)
        statements.sort(key=_position)
        for stmt in statements:
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

        self._build_training()
        self._build_loops()

    def _build_classes(self) -> None:
        defs = sorted(self.nodes(ast.ClassDef), key=_position)
        module_bases = self.names["module_bases"]
        function_bases = self.names["autograd_function_bases"]
        for node in defs:
            bases = [self.resolve(b) or dotted(b) or "" for b in node.bases]
            info = ClassInfo(node, bases)
            for b in bases:
                if b in module_bases or (
                    b.startswith("torch.nn.") and b.count(".") == 2 and b[9:10].isupper() and b != "torch.nn.Parameter"
                ):
                    info.is_module = True
                if b in function_bases:
                    info.is_function = True
            self.classes.setdefault(node.name, info)
        changed = True
        while changed:  # bases defined in the same file, in any order
            changed = False
            for info in self.classes.values():
                for b in info.bases:
                    base = self.classes.get(b)
                    if base is None or base is info:
                        continue
                    if base.is_module and not info.is_module:
                        info.is_module = changed = True
                    if base.is_function and not info.is_function:
                        info.is_function = changed = True

    @property
    def module_classes(self) -> list[ClassInfo]:
        return [c for c in self.classes.values() if c.is_module]

    @property
    def function_classes(self) -> list[ClassInfo]:
        return [c for c in self.classes.values() if c.is_function]

    def module_class_of(self, node: ast.AST) -> ClassInfo | None:
        info = self.class_of(node)
        return info if info is not None and info.is_module else None

    def forward_of(self, node: ast.AST) -> ClassInfo | None:
        """The nn.Module subclass when `node` lies inside its `forward` method."""
        fn = self.function_of(node)
        while fn is not None:
            owner = self.parents.get(fn)
            if isinstance(owner, ast.ClassDef):
                info = self.classes.get(owner.name)
                return info if info is not None and info.is_module and fn.name == "forward" else None
            fn = self.function_of(fn)
        return None

    def self_assignments(self, info: ClassInfo, method: str | None = "__init__") -> list[SelfAssign]:
        """`self.x = value` statements in a class's methods (one method, or all with None)."""
        if self._self_assigns is None:
            table: dict[ast.ClassDef, list[SelfAssign]] = {}
            for stmt in sorted(self.nodes(ast.Assign) + self.nodes(ast.AnnAssign), key=_position):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if stmt.value is None:
                    continue
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        fn = self.function_of(stmt)
                        owner = self.parents.get(fn) if fn is not None else None
                        if isinstance(owner, ast.ClassDef):
                            table.setdefault(owner, []).append(SelfAssign(target.attr, stmt.value, stmt, fn))
            self._self_assigns = table
        found = self._self_assigns.get(info.node, [])
        return [a for a in found if method is None or a.method.name == method]

    def self_reads(self, info: ClassInfo, skip: Iterable[str] = ("__init__",)) -> dict[str, list[ast.Attribute]]:
        """`self.x` reads in a class's methods (except `skip`), by attribute name."""
        skip = set(skip)
        reads: dict[str, list[ast.Attribute]] = {}
        for name, fn in info.methods.items():
            if name in skip:
                continue
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Load)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    reads.setdefault(node.attr, []).append(node)
        return reads

    # -- definitions (simple data flow inside one function) ---------------------------------

    def defs(self, scope: ast.AST) -> dict[str, list[tuple[ast.stmt, ast.expr]]]:
        """Assignments `name = value` in a scope, by name, in source order (tuple targets unpacked)."""
        if self._defs is None:
            table: dict[ast.AST, dict[str, list[tuple[ast.stmt, ast.expr]]]] = {}
            for stmt in sorted(self.nodes(ast.Assign) + self.nodes(ast.AnnAssign), key=_position):
                if stmt.value is None:
                    continue
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                where = table.setdefault(self.scope_of(stmt), {})
                for target in targets:
                    for name_node, value in _pairs(target, stmt.value):
                        where.setdefault(name_node, []).append((stmt, value))
            self._defs = table
        return self._defs.get(scope, {})

    def definitions(self, name: str, at: ast.AST) -> list[ast.expr]:
        """Values assigned to `name` in the scope of `at` by statements before the one holding `at`
        (so `att = att.softmax(-1)` looks up the earlier `att`), in source order."""
        scope = self.scope_of(at)
        stmt = self.statement_of(at) or at
        here = (getattr(stmt, "lineno", 1 << 30), getattr(stmt, "col_offset", 0))
        return [value for s, value in self.defs(scope).get(name, []) if (s.lineno, s.col_offset) < here]

    # -- training and loops ------------------------------------------------------------------

    def is_optimizer_step(self, call: ast.Call) -> bool:
        """`optimizer.step()` / `scaler.step(optimizer)` (not `scheduler.step()`, not `env.step(a)`)."""
        func = call.func
        if not isinstance(func, ast.Attribute) or func.attr != "step":
            return False
        kind = self.kind_of(func.value)
        if kind in ("optimizer", "scaler"):
            return True
        if kind is not None:
            return False
        return bool(call.args) and self.kind_of(call.args[0]) == "optimizer"

    def _build_training(self) -> None:
        backward = [c for c in self.method_calls("backward") + self.method_calls("manual_backward")]
        backward += self.calls_to("torch.autograd.backward")
        self.backward_calls = sorted(backward, key=_position)
        self.step_calls = [c for c in self.method_calls("step") if self.is_optimizer_step(c)]
        for call in self.backward_calls + self.step_calls:
            fn = self.function_of(call)
            if fn is not None:
                self.training_functions.add(fn)
        # Functions that call a training function of this file train too.
        local_calls = self._local_function_calls()
        changed = True
        rounds = 0
        while changed and rounds < 8:
            changed = False
            rounds += 1
            for call, target in local_calls:
                if target in self.training_functions:
                    fn = self.function_of(call)
                    if fn is not None and fn not in self.training_functions:
                        self.training_functions.add(fn)
                        changed = True

    def _local_function_calls(self) -> list[tuple[ast.Call, ast.AST]]:
        """(call, function) for calls of this file's functions and of methods through `self.`."""
        if self._local_calls is not None:
            return self._local_calls
        pairs: list[tuple[ast.Call, ast.AST]] = []
        for call in self.nodes(ast.Call):
            func = call.func
            if isinstance(func, ast.Name) and func.id in self.functions:
                pairs.append((call, self.functions[func.id]))
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                info = self.class_of(call)
                if info is not None:
                    target = info.method(func.attr)
                    if target is not None:
                        pairs.append((call, target))
        self._local_calls = pairs
        return pairs

    def callers(self, fn: ast.AST) -> list[ast.Call]:
        """Calls of a function (or of a method through `self.`) in this file."""
        if self._callers is None:
            table: dict[ast.AST, list[ast.Call]] = {}
            for call, target in self._local_function_calls():
                table.setdefault(target, []).append(call)
            self._callers = table
        return self._callers.get(fn, [])

    def loop_of(self, node: ast.AST) -> Loop | None:
        """The innermost loop whose body (or `while` test) holds `node`, within the same function."""
        path: list[ast.AST] = []
        child = node
        current = self.parents.get(node)
        result: Loop | None = None
        while current is not None:
            if child is not node and child in self._loop_of:
                result = self._loop_of[child]
                break
            if isinstance(current, SCOPES):
                break
            if isinstance(current, LOOPS) and child is not getattr(current, "iter", None) and child is not getattr(
                current, "target", None
            ) and child not in current.orelse:
                result = self.loops.get(current)
                break
            path.append(child)
            child = current
            current = self.parents.get(current)
        for p in path:
            self._loop_of[p] = result
        return result

    def loops_around(self, node: ast.AST) -> list[Loop]:
        """Enclosing loops of `node` in its function, innermost first."""
        out: list[Loop] = []
        loop = self.loop_of(node)
        while loop is not None:
            out.append(loop)
            loop = loop.parent
        return out

    def training_loop_of(self, node: ast.AST) -> Loop | None:
        """The innermost enclosing loop that trains (backward/step in it or below it)."""
        for loop in self.loops_around(node):
            if loop.trains:
                return loop
        return None

    def step_loop_of(self, node: ast.AST) -> Loop | None:
        """The innermost enclosing per-batch training loop (backward or optimizer step directly in it)."""
        for loop in self.loops_around(node):
            if loop.has_backward or loop.has_step:
                return loop
        return None

    def _iter_source(self, iterable: ast.AST) -> ast.AST:
        wrappers = self.names["iteration_wrappers"]
        for _ in range(4):
            if isinstance(iterable, ast.Call) and iterable.args and self.callee(iterable) in wrappers:
                iterable = iterable.args[0]
            else:
                break
        return iterable

    def _build_loops(self) -> None:
        nodes = sorted(self.nodes(ast.For) + self.nodes(ast.AsyncFor) + self.nodes(ast.While), key=_position)
        if not nodes:
            return
        for node in nodes:  # outer loops come first in source order
            parent = self.loop_of(node)
            targets: tuple[str, ...] = ()
            source = None
            binding = None
            iterates_loader = False
            if isinstance(node, ast.For | ast.AsyncFor):
                targets = tuple(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
                src = self._iter_source(node.iter)
                source = dotted(src)
                binding = self.binding(src)
                iterates_loader = (binding is not None and binding.kind == "dataloader") or (
                    binding is None and looks_like_loader(source)
                )
            loop = Loop(node, self.scope_of(node), parent, targets, source, binding, iterates_loader)
            self.loops[node] = loop
            if parent is not None:
                parent.children.append(loop)
        for call in self.nodes(ast.Call):
            loop = self.loop_of(call)
            if loop is not None:
                loop.calls.append(call)
        backward = set(self.backward_calls)
        steps = set(self.step_calls)
        local_targets = dict(self._local_function_calls())
        for loop in self.loops.values():
            loop.calls.sort(key=_position)
            for call in loop.calls:
                if call in backward:
                    loop.has_backward = True
                elif call in steps:
                    loop.has_step = True
                target = local_targets.get(call)
                if target is not None and target in self.training_functions:
                    loop.calls_training = True
        for loop in sorted(self.loops.values(), key=lambda lp: -_depth(lp)):
            loop.trains = loop.has_backward or loop.has_step or loop.calls_training or any(
                c.trains for c in loop.children
            )
        for loop in self.loops.values():
            if loop.has_backward or loop.has_step or loop.iterates_loader:
                loop.kind = "batch"
            elif loop.trains or any("epoch" in t.lower() for t in loop.targets):
                loop.kind = "epoch"
        for loop in self.loops.values():
            loop.validation = self._is_validation(loop)

    def _is_validation(self, loop: Loop) -> bool:
        """A loop that runs the model without training it, over data named or used as evaluation data."""
        if loop.trains or loop.source is None:
            return False
        if not any(self.is_model(c.func) for c in loop.all_calls() if isinstance(c.func, ast.Name | ast.Attribute)):
            return False
        if is_eval_word(loop.source):  # val_loader, test_set, eval_dl
            return True
        if not loop.iterates_loader:
            return False
        fn = self.function_of(loop.node)
        if fn is not None and is_eval_word(fn.name):  # def evaluate(model, loader)
            return True
        # `model.eval()` earlier in the same function (and no `model.train()` since), then a loop over a loader.
        mode_calls = [
            c
            for c in self.method_calls("eval") + self.method_calls("train")
            if self.scope_of(c) is loop.scope
            and c.lineno < loop.node.lineno
            and self.is_model(c.func.value)  # type: ignore[attr-defined]
        ]
        if mode_calls:
            last = max(mode_calls, key=_position)
            return last.func.attr == "eval" and not last.args  # type: ignore[attr-defined]
        return False

    def training_loops(self) -> list[Loop]:
        return [lp for lp in self.loops.values() if lp.trains]

    def validation_loops(self) -> list[Loop]:
        return [lp for lp in self.loops.values() if lp.validation]

    def epoch_loops(self) -> list[Loop]:
        return [lp for lp in self.loops.values() if lp.kind == "epoch"]

    # -- regions -----------------------------------------------------------------------------

    def _is_grad_off(self, expr: ast.AST) -> bool:
        """A context manager / decorator expression that disables autograd (or might: conditional)."""
        if isinstance(expr, ast.IfExp):
            return self._is_grad_off(expr.body) or self._is_grad_off(expr.orelse)
        if isinstance(expr, ast.Name | ast.Attribute):
            q = self.resolve(expr)
            if q in self.names["no_grad"]:
                return True  # bare decorator `@torch.no_grad`
            b = self.binding(expr)
            return b is not None and b.kind == "grad-mode" and b.call is not None and self._is_grad_off(b.call)
        if not isinstance(expr, ast.Call):
            return False
        q = self.resolve(expr.func)
        if q in self.names["no_grad"]:
            mode = kwarg(expr, "mode", 0)
            return not is_constant(mode, False) if q.endswith("inference_mode") else True
        if q in self.names["set_grad_enabled"]:
            return not is_constant(kwarg(expr, "mode", 0), True)
        return False

    def grad_disabled(self, node: ast.AST, _depth: int = 0) -> bool:
        """Whether autograd is (or may be) off at `node`: no_grad/inference_mode blocks, decorators,
        `torch.set_grad_enabled(False)` before it, or every caller in the file calls it with grad off."""
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, WITHS) and child in anc.body:
                if any(self._is_grad_off(item.context_expr) and not self._train_or_eval_toggle(item.context_expr, anc)
                       for item in anc.items):
                    return True
            elif isinstance(anc, FUNCTIONS):
                if any(self._is_grad_off(d) for d in anc.decorator_list):
                    return True
                if self._set_grad_false_before(anc, node):
                    return True
                callers = self.callers(anc)
                if callers and _depth < 4 and all(self.grad_disabled(c, _depth + 1) for c in callers):
                    return True
                return False
            elif isinstance(anc, ast.Lambda | ast.ClassDef):
                return False
            child = anc
        return self._set_grad_false_before(self.tree, node)

    def _train_or_eval_toggle(self, expr: ast.AST, block: ast.AST) -> bool:
        """`with torch.set_grad_enabled(train):` around a body that calls backward(): one function for both
        training and evaluation, with grad on whenever the backward runs."""
        if not (isinstance(expr, ast.Call) and self.resolve(expr.func) in self.names["set_grad_enabled"]):
            return False
        mode = kwarg(expr, "mode", 0)
        if mode is None or isinstance(mode, ast.Constant):
            return False
        backward = set(self.backward_calls)
        return any(isinstance(n, ast.Call) and n in backward for n in ast.walk(block))

    def _set_grad_false_before(self, scope: ast.AST, node: ast.AST) -> bool:
        line = getattr(node, "lineno", 0)
        for call in self.calls_to(*sorted(self.names["set_grad_enabled"])):
            if (
                isinstance(self.parents.get(call), ast.Expr)
                and call.lineno < line
                and self.scope_of(call) is scope
                and not is_constant(kwarg(call, "mode", 0), True)
            ):
                return True
        return False

    def autocast_at(self, node: ast.AST) -> AutocastRegion | None:
        """The autocast region around `node` (a `with` block or a decorated function), if any."""
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, WITHS) and child in anc.body:
                for item in anc.items:
                    region = self._autocast_region(item.context_expr, anc)
                    if region is not None:
                        return region
            elif isinstance(anc, FUNCTIONS):
                for d in anc.decorator_list:
                    region = self._autocast_region(d, anc)
                    if region is not None:
                        return region
            child = anc
        return None

    def _autocast_region(self, expr: ast.AST, owner: ast.AST) -> AutocastRegion | None:
        if isinstance(expr, ast.IfExp):
            return self._autocast_region(expr.body, owner) or self._autocast_region(expr.orelse, owner)
        call: ast.Call | None = None
        if isinstance(expr, ast.Call) and self.resolve(expr.func) in self.names["autocast"]:
            call = expr
        elif isinstance(expr, ast.Name | ast.Attribute):
            b = self.binding(expr)
            if b is not None and b.kind == "autocast":
                call = b.call
        if call is None:
            return None
        q = self.resolve(call.func) or ""
        if q.startswith("torch.cuda."):
            device: str | None = "cuda"
        elif q.startswith("torch.cpu."):
            device = "cpu"
        else:
            arg = kwarg(call, "device_type", 0)
            device = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
        dtype_expr = kwarg(call, "dtype", 1 if q in ("torch.autocast", "torch.amp.autocast") else 0)
        if q.startswith(("torch.cuda.", "torch.cpu.")):
            dtype_expr = kwarg(call, "dtype")
        dtype = _dtype_name(self.resolve(dtype_expr)) if dtype_expr is not None else None
        if dtype_expr is None:
            dtype = {"cuda": "float16", "cpu": "bfloat16"}.get(device or "")
        return AutocastRegion(owner, call, device, dtype)

    def autocast_regions(self) -> list[AutocastRegion]:
        regions: list[AutocastRegion] = []
        for node in self.nodes(ast.With) + self.nodes(ast.AsyncWith):
            for item in node.items:
                r = self._autocast_region(item.context_expr, node)
                if r is not None:
                    regions.append(r)
        return regions

    # -- rank guards -------------------------------------------------------------------------

    def _rank_expr(self, expr: ast.AST) -> bool:
        """`rank`, `args.local_rank`, `dist.get_rank()`, `int(os.environ["RANK"])`, ..."""
        names = self.vocab["rank"]["rank_names"]
        if isinstance(expr, ast.Call):
            if last_name(expr.func) in ("get_rank", "get_global_rank", "get_local_rank"):
                return True
            if isinstance(expr.func, ast.Name) and expr.func.id == "int" and expr.args:
                return self._rank_expr(expr.args[0])
            if last_name(expr.func) == "get" and expr.args:  # os.environ.get("RANK", 0)
                return self._rank_expr(expr.args[0])
            return False
        if isinstance(expr, ast.Subscript):
            return self._rank_expr(expr.slice)
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value in names
        return last_name(expr) in names

    def is_rank_zero_test(self, test: ast.AST) -> bool:
        """A condition true on the main process only."""
        main = self.vocab["rank"]["main_process_names"]
        if isinstance(test, ast.BoolOp):
            if isinstance(test.op, ast.And):
                return any(self.is_rank_zero_test(v) for v in test.values)
            # `not dist.is_initialized() or dist.get_rank() == 0`
            return any(self.is_rank_zero_test(v) for v in test.values) and all(
                self.is_rank_zero_test(v) or _is_single_process_test(v) for v in test.values
            )
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self._rank_expr(test.operand)  # `if not rank:`
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if isinstance(op, ast.Eq | ast.Is):
                return (is_constant(right, 0) and self._rank_expr(left)) or (
                    is_constant(left, 0) and self._rank_expr(right)
                )
            if isinstance(op, ast.In) and isinstance(right, ast.Tuple | ast.List | ast.Set):
                values = {e.value for e in right.elts if isinstance(e, ast.Constant)}
                return self._rank_expr(left) and values <= {0, -1} and 0 in values
            if isinstance(op, ast.Lt | ast.LtE):
                return self._rank_expr(left) and (is_constant(right, 1) if isinstance(op, ast.Lt) else is_constant(right, 0))
            return False
        return last_name(test) in main

    def is_not_rank_zero_test(self, test: ast.AST) -> bool:
        """A condition true on every process except the main one (`if rank != 0: return`)."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.is_rank_zero_test(test.operand)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if isinstance(op, ast.NotEq | ast.IsNot | ast.Gt):
                return (is_constant(right, 0) and self._rank_expr(left)) or (
                    is_constant(left, 0) and self._rank_expr(right)
                )
        return False

    def rank_guarded(self, node: ast.AST, _depth: int = 0) -> bool:
        """Whether `node` runs on the main process only."""
        decorators = self.vocab["rank"]["rank_zero_decorators"]
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, ast.If | ast.IfExp):
                in_body = child in anc.body if isinstance(anc.body, list) else child is anc.body
                in_else = child in anc.orelse if isinstance(anc.orelse, list) else child is anc.orelse
                if in_body and self.is_rank_zero_test(anc.test):
                    return True
                if in_else and self.is_not_rank_zero_test(anc.test):
                    return True
            if isinstance(child, ast.stmt):
                body = _body_holding(anc, child)
                if body is not None and self._early_exit_before(body, child):
                    return True
            if isinstance(anc, FUNCTIONS):
                if any(last_name(d) in decorators for d in anc.decorator_list):
                    return True
                callers = self.callers(anc)
                if callers and _depth < 4 and all(self.rank_guarded(c, _depth + 1) for c in callers):
                    return True
                return False
            child = anc
        return False

    def _early_exit_before(self, body: list[ast.stmt], stmt: ast.stmt) -> bool:
        """`if rank != 0: return` (or continue/raise/sys.exit) earlier in the same block."""
        for s in body:
            if s is stmt:
                return False
            if (
                isinstance(s, ast.If)
                and self.is_not_rank_zero_test(s.test)
                and s.body
                and isinstance(s.body[-1], ast.Return | ast.Continue | ast.Raise)
            ):
                return True
        return False

    # -- contexts ----------------------------------------------------------------------------

    def uses_accelerate(self) -> bool:
        """An `accelerate.Accelerator` is built: it places each process on its own GPU when there is one."""
        return bool(self.calls_to("accelerate.Accelerator"))

    def contexts(self) -> set[str]:
        """Setup facts for the router (routing.toml [[context]])."""
        out: set[str] = set()
        if (
            self.uses("torch.distributed")
            or any(b.wrapper in ("ddp", "fsdp") for b in self.bindings_of("module"))
            or self.calls_to(*sorted(self.names["ddp"] | self.names["fsdp"]))
        ):
            out.add("distributed")
        if self.bindings_of("scaler") or self.autocast_regions() or self.calls_to(
            *sorted(self.names["autocast"] | self.names["scalers"])
        ):
            out.add("amp")
        if self.calls_to(*sorted(self.names["compile"])):
            out.add("compile")
        if "cuda" in self.source and _GPU.search(self.source):
            out.add("gpu")
        if self.function_classes:
            out.add("custom-autograd")
        return out


_GPU = re.compile(r"""\.cuda\(|["']cuda(?::\d+)?["']""")


def _position(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _depth(loop: Loop) -> int:
    d = 0
    while loop.parent is not None:
        loop = loop.parent
        d += 1
    return d


def _pairs(target: ast.AST, value: ast.expr) -> Iterator[tuple[str, ast.expr]]:
    if isinstance(target, ast.Name):
        yield target.id, value
    elif isinstance(target, ast.Attribute | ast.Subscript):
        name = dotted(target)
        if name is not None:
            yield name, value
    elif isinstance(target, ast.Tuple | ast.List):
        if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                yield from _pairs(t, v)
        else:
            for t in target.elts:
                if isinstance(t, ast.Starred):
                    t = t.value
                yield from _pairs(t, value)  # each element comes from the same value


def _dtype_name(q: str | None) -> str | None:
    return {
        "torch.float16": "float16",
        "torch.half": "float16",
        "torch.bfloat16": "bfloat16",
        "torch.float32": "float32",
        "torch.float": "float32",
    }.get(q or "")


def _is_single_process_test(test: ast.AST) -> bool:
    """`not dist.is_initialized()`, `not ddp`, `world_size == 1`: true when not distributed."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and last_name(test.left) in ("world_size", "WORLD_SIZE"):
        return isinstance(test.ops[0], ast.Eq | ast.LtE) and is_constant(test.comparators[0], 1)
    return False


def _body_holding(parent: ast.AST, stmt: ast.stmt) -> list[ast.stmt] | None:
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and stmt in block:
            return block
    return None

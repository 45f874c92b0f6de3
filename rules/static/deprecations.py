"""Generate rules/data/deprecated.toml from the installed torch's own source.

    python -m torchdoctor.rules.static.deprecations [--out PATH] [--torch-dir DIR]

The table of deprecated and removed torch names is not kept by hand: this
module reads the .py files of the installed torch package with `ast` (it never
imports torch) and collects what torch itself says is deprecated:

- functions, classes and methods decorated with `@deprecated("...")`
  (typing_extensions / warnings), and `name = deprecated("...")(func)`;
- public functions and methods that call `warnings.warn(msg, ...)` with a
  message saying "deprecated" / "will be removed", directly or through a
  private helper (`_deprecated("broadcast", "...")`), or that are built by a
  factory whose inner function warns (`uniform = _make_deprecate(uniform_)`);
- arguments whose use warns (`if grad_variables is not None: warn(...)`, or
  `if dim is None: dim = _get_softmax_dim(...)` for an argument left out);
- names a module's `__getattr__` warns about (`_deprecated_attrs`);
- removed functions kept only to raise "... is now removed" (`torch.solve`).

Each entry gets the public dotted names it is reachable by (the defining
module when public, and every public module that re-exports it), the
message (messages with f-string parts are rendered with the helper's
arguments), the replacement the message names, and the version it gives.
`torchdoctor check` (TD608) only reads the generated TOML.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from torchdoctor.rules.static.semantic.syntax import own_nodes

_DEPRECATION = re.compile(r"deprecat|will be removed|scheduled for removal", re.I)
_REMOVED = re.compile(r"\b(?:is|are|was|were|has been|have been) (?:now )?removed\b", re.I)
_DEPRECATED_DECORATORS = frozenset({"typing_extensions.deprecated", "warnings.deprecated"})
_WARN = frozenset({"warnings.warn"})
Function = ast.FunctionDef | ast.AsyncFunctionDef
_TEXT_CLEANERS = frozenset({"trim", "dedent", "cleandoc", "strip"})  # change whitespace only


# -- values: strings rendered from the source, with `{expr}` for what cannot be known -------------


@dataclass(frozen=True)
class Ref:
    """A name bound to code rather than text (`uniform_`, `torch.backends.mps.is_built`)."""

    dotted: str


Value = str | Ref


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)  # local name -> qualified name
    # (alias, source module, source name, stated as a re-export)
    reexports: list[tuple[str, str, str, bool]] = field(default_factory=list)
    package: bool = False
    stars: list[str] = field(default_factory=list)
    consts: dict[str, ast.expr] = field(default_factory=dict)  # module-level NAME = expr
    functions: dict[str, Function] = field(default_factory=dict)  # module-level defs
    all: list[str] | None = None

    def qualify(self, expr: ast.AST) -> str | None:
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        base = self.imports.get(expr.id, expr.id)
        return ".".join([base, *reversed(parts)])


def _dotted(expr: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        return ".".join([expr.id, *reversed(parts)])
    return None


class Renderer:
    """Evaluates the string expressions of a warning in an environment of known names."""

    def __init__(self, module: Module, env: dict[str, Value]):
        self.module = module
        self.env = env

    def value(self, expr: ast.AST | None, depth: int = 0) -> Value:
        if expr is None or depth > 8:
            return "{?}"
        if isinstance(expr, ast.Constant):
            return expr.value if isinstance(expr.value, str) else str(expr.value)
        if isinstance(expr, ast.JoinedStr):
            return "".join(self.text(v, depth + 1) for v in expr.values)
        if isinstance(expr, ast.FormattedValue):
            return self.text(expr.value, depth + 1)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return self.text(expr.left, depth + 1) + self.text(expr.right, depth + 1)
        if isinstance(expr, ast.Name):
            if expr.id in self.env:
                return self.env[expr.id]
            const = self.module.consts.get(expr.id)
            if const is not None:
                return self.value(const, depth + 1)
            return "{" + expr.id + "}"
        if isinstance(expr, ast.Attribute) and expr.attr in ("__name__", "__module__", "__qualname__"):
            inner = self.value(expr.value, depth + 1)
            if isinstance(inner, Ref):
                head, _, tail = inner.dotted.rpartition(".")
                return head if expr.attr == "__module__" else tail
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Slice):
            inner = self.value(expr.value, depth + 1)
            bounds = [expr.slice.lower, expr.slice.upper]
            if isinstance(inner, str) and "{" not in inner and all(
                b is None or (isinstance(b, ast.UnaryOp | ast.Constant)) for b in bounds
            ):
                try:
                    lo, hi = (None if b is None else ast.literal_eval(b) for b in bounds)
                    return inner[lo:hi]
                except (ValueError, TypeError):
                    pass
        if (
            isinstance(expr, ast.Call)
            and len(expr.args) == 1
            and (_dotted(expr.func) or "").rpartition(".")[2] in _TEXT_CLEANERS
        ):
            return self.value(expr.args[0], depth + 1)  # `trim("""...""")`: the text, whitespace aside
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and expr.func.attr == "format"
        ):
            template = self.value(expr.func.value, depth + 1)
            if isinstance(template, str):
                values = {kw.arg: self.text(kw.value, depth + 1) for kw in expr.keywords if kw.arg}
                positional = iter([self.text(a, depth + 1) for a in expr.args])
                return re.sub(
                    r"\{(\w*)\}",
                    lambda m: values.get(m.group(1), m.group(0)) if m.group(1) else next(positional, "{}"),
                    template,
                )
        return "{" + ast.unparse(expr) + "}"

    def text(self, expr: ast.AST | None, depth: int = 0) -> str:
        v = self.value(expr, depth)
        return v.dotted if isinstance(v, Ref) else v


# -- reading torch -----------------------------------------------------------------------------


def torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed in this environment")
    return Path(next(iter(spec.submodule_search_locations)))


def torch_version(root: Path) -> str:
    version = root / "version.py"
    if version.exists():
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", version.read_text(), re.M)
        if m:
            return m.group(1)
    return "unknown"


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_public(dotted: str) -> bool:
    return all(not p.startswith("_") for p in dotted.split("."))


def _read(root: Path, path: Path) -> Module | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return None
    name = module_name(root, path)
    module = Module(name, path, tree, package=path.name == "__init__.py")
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    module.imports[alias.asname] = alias.name
                else:
                    module.imports.setdefault(alias.name.split(".")[0], alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                source = ".".join(base + ([source] if source else []))
            top_level = node in tree.body or any(node in getattr(s, "body", []) for s in tree.body)
            for alias in node.names:
                if alias.name == "*":
                    if top_level:
                        module.stars.append(source)
                    continue
                local = alias.asname or alias.name
                module.imports[local] = f"{source}.{alias.name}"
                if top_level:
                    explicit = alias.asname == alias.name  # `from x import y as y`: a stated re-export
                    module.reexports.append((local, source, alias.name, explicit))
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            module.consts[stmt.targets[0].id] = stmt.value
            if stmt.targets[0].id == "__all__" and isinstance(stmt.value, ast.List | ast.Tuple):
                module.all = [e.value for e in stmt.value.elts if isinstance(e, ast.Constant)]
        elif isinstance(stmt, Function):
            module.functions[stmt.name] = stmt
    return module


# -- where a warning fires: always, or only for some arguments ---------------------------------


@dataclass(frozen=True)
class Condition:
    when: str = "always"  # always | passed (not None) | set (a true value) | omitted
    arguments: tuple[str, ...] = ()


def _parameters(fn: Function) -> dict[str, ast.expr | None]:
    """Parameter -> its default (None when it has none)."""
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults: dict[str, ast.expr | None] = {a.arg: None for a in positional + args.kwonlyargs}
    for a, d in zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True):
        defaults[a.arg] = d
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        defaults[a.arg] = d
    return defaults


def _names(expr: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}


def _is_dispatch_test(test: ast.AST) -> bool:
    """`if has_torch_function(...)`: the __torch_function__ hand-off, not a user's choice."""
    return any(
        isinstance(n, ast.Call) and (_dotted(n.func) or "").rpartition(".")[2].startswith("has_torch_function")
        for n in ast.walk(test)
    )


def _reads_environment(test: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv") for n in ast.walk(test))


def _classify(test: ast.AST, params: dict[str, ast.expr | None]) -> Condition | None:
    """`p is not None` / `p` -> passed; `p is None` / `not p` -> omitted; anything else -> unknown."""
    def optional(p: str) -> bool:
        d = params.get(p)
        return isinstance(d, ast.Constant) and d.value in (None, False)

    if isinstance(test, ast.Name) and test.id in params and optional(test.id):
        return Condition("set", (test.id,))  # a true value: `use_cuda=False` does not warn
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Name):
        p = test.operand.id
        if p in params and isinstance(params[p], ast.Constant) and params[p].value is None:  # type: ignore[union-attr]
            return Condition("omitted", (p,))
    if (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id in params
        and len(test.ops) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
        and optional(test.left.id)
    ):
        if isinstance(test.ops[0], ast.IsNot | ast.NotEq):
            return Condition("passed", (test.left.id,))
        if isinstance(test.ops[0], ast.Is | ast.Eq):
            return Condition("omitted", (test.left.id,))
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        parts = [_classify(v, params) for v in test.values]
        whens = {p.when for p in parts if p is not None}
        if None not in parts and len(whens) == 1 and whens != {"omitted"}:
            return Condition(whens.pop(), tuple(a for p in parts for a in p.arguments))  # type: ignore[union-attr]
    return None


def _negate(c: Condition | None) -> Condition | None:
    if c is None or len(c.arguments) != 1:
        return None
    return Condition({"passed": "omitted", "omitted": "passed"}[c.when], c.arguments)


def _exits(body: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Return | ast.Raise) for s in body for n in ast.walk(s))


def _bound_names(fn: Function) -> set[str]:
    """Names a function binds itself: parameters (with *args/**kwargs), assignments, loop and with targets."""
    args = fn.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for node in _own_nodes(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names  # `self` too: a test on the instance's state depends on how it was built


def _truth(test: ast.AST, known: dict[str, object]) -> bool | None:
    """The value of `p`, `not p`, `p is None`, `p is not None` when `p`'s value is known."""
    if isinstance(test, ast.Name) and test.id in known:
        return bool(known[test.id])
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _truth(test.operand, known)
        return None if inner is None else not inner
    if (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id in known
        and len(test.ops) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
        and isinstance(test.ops[0], ast.Is | ast.IsNot)
    ):
        is_none = known[test.left.id] is None
        return is_none if isinstance(test.ops[0], ast.Is) else not is_none
    return None


def condition(
    node: ast.AST, fn: Function | None, parents: dict[ast.AST, ast.AST], known: dict[str, object] | None = None
) -> Condition | None:
    """When the warning at `node` fires, as seen by a caller of `fn`; None when it depends on values.

    A test on module globals only (`sys.version_info`, `torch.jit.is_scripting()`) does not count; a
    test on the function's own names does, and only `p is not None` / `p is None` on a parameter
    that defaults to None is understood (the argument passed, or left out)."""
    params = _parameters(fn) if fn is not None else {}
    params.pop("self", None)
    params.pop("cls", None)
    local = _bound_names(fn) if fn is not None else set()
    found: Condition | None = None
    child, current = node, parents.get(node)
    while current is not None and current is not fn:
        if isinstance(current, ast.ExceptHandler | ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef):
            return None  # a failure path, or a nested function (seen from its own definition)
        if isinstance(current, ast.For | ast.AsyncFor | ast.While) and child is not current.orelse:
            loop_on = current.iter if isinstance(current, ast.For | ast.AsyncFor) else current.test
            if _names(loop_on) & local:
                return None  # once per item of the caller's data: not a property of the name
        if isinstance(current, ast.If) and child is not current.test and not _is_dispatch_test(current.test):
            if _reads_environment(current.test):
                return None  # `if os.getenv("TORCH_HUB")`: a setting, not the call
            truth = _truth(current.test, known or {})
            if truth is not None:
                if truth != (child in current.body):
                    return None  # never reached with these arguments
                child, current = current, parents.get(current)
                continue
            if _names(current.test) & local:
                c = _classify(current.test, params)
                if child in current.orelse:
                    c = _negate(c)
                if c is None or found is not None:
                    return None
                found = c
        if isinstance(current, ast.IfExp | ast.BoolOp) and child is not getattr(current, "test", None):
            return None
        # An earlier `if <argument test>: return/raise` in the same block makes this depend on the arguments.
        for attr in ("body", "orelse", "finalbody"):
            block = getattr(current, attr, None)
            if isinstance(block, list) and child in block:
                for stmt in block[: block.index(child)]:
                    if (
                        isinstance(stmt, ast.If)
                        and _names(stmt.test) & local
                        and not _is_dispatch_test(stmt.test)
                        and _exits(stmt.body)
                    ):
                        return None
        child, current = current, parents.get(current)
    return found or Condition()


# -- the scan ----------------------------------------------------------------------------------


@dataclass
class Site:
    module: str  # defining module
    qual: str  # dotted path inside it; "" for the module itself
    kind: str  # function | class | method | attribute | module | argument
    message: str
    removed: bool = False
    argument: str = ""
    when: str = ""
    position: int = -1


class Scanner:
    def __init__(self, root: Path):
        self.root = root
        self.modules: dict[str, Module] = {}
        self.sites: list[Site] = []
        self._parents: dict[str, dict[ast.AST, ast.AST]] = {}
        self._memo: dict[tuple[str, int], list[tuple[Condition, str, bool]]] = {}
        self.helpers: set[str] = set()  # private functions that warn about a deprecation

    def load(self, path: Path) -> Module | None:
        name = module_name(self.root, path)
        if name not in self.modules:
            m = _read(self.root, path)
            if m is None:
                return None
            self.modules[name] = m
        return self.modules[name]

    def parents(self, m: Module) -> dict[ast.AST, ast.AST]:
        if m.name not in self._parents:
            self._parents[m.name] = {c: p for p in ast.walk(m.tree) for c in ast.iter_child_nodes(p)}
        return self._parents[m.name]

    def files(self) -> Iterator[Path]:
        yield from sorted(self.root.rglob("*.py"))

    def scan(self) -> None:
        texts = {p: p.read_text(encoding="utf-8", errors="replace") for p in self.files()}
        todo = [p for p, t in texts.items() if re.search(r"deprecat|removed", t, re.I)]
        done: set[Path] = set()
        # 1. The modules that say "deprecated", and those that call a private helper that warns,
        #    until no new helper turns up (helpers first: a caller may be read before its helper).
        while todo:
            loaded = [m for m in (self.load(p) for p in todo) if m is not None]
            done.update(todo)
            for m in loaded:
                self._register_helpers(m)
            words = sorted(self.helpers)
            wanted = re.compile("|".join(rf"\b{re.escape(h)}\s*\(" for h in words)) if words else None
            todo = [
                p for p, t in texts.items()
                if p not in done and wanted is not None and any(w in t for w in words) and wanted.search(t)
            ]
        for m in list(self.modules.values()):
            self.scan_module(m)
        # 2. Subclasses of a class whose construction warns (`class MSELoss(_Loss)`), in other files.
        for _ in range(4):
            bases = sorted({s.qual.split(".")[0] for s in self.sites if s.kind in ("class", "argument") and s.qual})
            if not bases:
                break
            wanted = re.compile("|".join(rf"class\s+\w+\s*\((?:[\w.]+\.)?{re.escape(b)}\b" for b in bases))
            more = [p for p, t in texts.items() if p not in done and any(b in t for b in bases) and wanted.search(t)]
            if not more:
                break
            done.update(more)
            for m in [m for m in (self.load(p) for p in more) if m is not None]:
                self.scan_module(m)
        self._inherit_methods([self.modules[module_name(self.root, p)] for p in sorted(done)
                               if module_name(self.root, p) in self.modules])
        # 3. What may re-export the names found: packages, and modules with an __all__.
        wanted_names = {s.qual.split(".")[0] for s in self.sites if s.qual} | {
            s.module.rpartition(".")[2] for s in self.sites
        }
        for path, text in texts.items():
            if (path.name == "__init__.py" or "__all__" in text) and any(w in text for w in wanted_names):
                self.load(path)

    def _inherit_methods(self, modules: list[Module]) -> None:
        """`StepLR.step(epoch)` warns like `LRScheduler.step(epoch)`: a subclass that does not override a
        method gets its base's method entries, under its own name (the name a script's object has)."""
        by_class: dict[tuple[str, str], list[Site]] = {}
        for site in self.sites:
            head, _, method = site.qual.partition(".")
            if method and "." not in method and site.kind == "argument":
                by_class.setdefault((site.module, head), []).append(site)
        if not by_class:
            return
        for m in modules:
            for cls in m.tree.body:
                if not isinstance(cls, ast.ClassDef):
                    continue
                defined = {f.name for f in cls.body if isinstance(f, Function)}
                owner = self.class_def(m, cls.bases[0]) if cls.bases else None
                for _ in range(6):
                    if owner is None:
                        break
                    bm, bcls = owner
                    for site in by_class.get((bm.name, bcls.name), []):
                        method = site.qual.partition(".")[2]
                        if method not in defined:
                            self.sites.append(
                                Site(m.name, f"{cls.name}.{method}", site.kind, site.message, site.removed,
                                     site.argument, site.when, site.position)
                            )
                    defined |= {f.name for f in bcls.body if isinstance(f, Function)}
                    owner = self.class_def(bm, bcls.bases[0]) if bcls.bases else None

    def _register_helpers(self, m: Module) -> None:
        """Private functions that always warn about a deprecation: their callers elsewhere warn too."""
        parents = self.parents(m)
        for name, fn in m.functions.items():
            if name.startswith("__") or not (name.startswith("_") or not _is_public(m.name)):
                continue
            env = self._locals(m, fn, {})
            defaults = {k: d.value for k, d in _parameters(fn).items() if isinstance(d, ast.Constant)}
            for node in _own_nodes(fn):
                if isinstance(node, ast.Call) and m.qualify(node.func) in _WARN and node.args:
                    if condition(node, fn, parents, defaults) == Condition() and _DEPRECATION.search(
                        Renderer(m, env).text(node.args[0])
                    ):
                        self.helpers.add(name)

    # Calls of warnings.warn and of private helpers that warn, inside one function's own body.
    def _warnings_in(self, m: Module, fn: ast.AST) -> Iterator[tuple[ast.Call, str, bool]]:
        """(call, rendered message, removed) for each deprecation warning raised in `fn`'s own body."""
        known: list[dict[str, Value]] = []

        def env() -> dict[str, Value]:  # the locals, worked out only for functions that warn
            if not known:
                known.append(self._locals(m, fn, {}))
            return known[0]

        for node in _own_nodes(fn):
            if isinstance(node, ast.Call):
                q = m.qualify(node.func)
                if q in _WARN and node.args:
                    text = Renderer(m, env()).text(node.args[0])
                    if _DEPRECATION.search(text) and _warning_category(m, node):
                        yield node, text, False
                else:
                    found = self.helper(m, node.func)
                    if found is not None:
                        text = self._helper_message(m, found[0], found[1], node, env())
                        if text is not None:
                            yield node, text, False
            elif isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc
                if isinstance(exc, ast.Call) and exc.args:
                    text = Renderer(m, env()).text(exc.args[0])
                    # "deprecated ... and is now removed", or a function whose body is only the error
                    always = node in getattr(fn, "body", [])
                    if _REMOVED.search(text) and (always or _DEPRECATION.search(text)):
                        yield node, text, True  # type: ignore[misc]

    def helper(self, m: Module, func: ast.expr) -> tuple[Module, Function] | None:
        """A private function a call reaches: `_deprecated(...)` in the same module, or
        `_Reduction.legacy_get_string(...)` in a private module of torch."""
        if isinstance(func, ast.Name) and func.id in m.functions:
            return (m, m.functions[func.id]) if func.id.startswith("_") else None
        q = m.qualify(func)
        if not q or not q.startswith("torch.") or q.count(".") < 2 or q.rpartition(".")[2] not in self.helpers:
            return None
        module, _, name = q.rpartition(".")
        if _is_public(q):
            return None
        path = self.root.parent / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = self.root.parent / module.replace(".", "/") / "__init__.py"
        target = self.load(path) if path.exists() else None
        if target is None or name not in target.functions:
            return None
        return target, target.functions[name]

    def _helper_message(
        self, m: Module, hm: Module, helper: Function, call: ast.Call, env: dict[str, Value]
    ) -> str | None:
        """The message a private helper warns with, for these arguments, when it always warns."""
        outer = Renderer(m, env)
        bound: dict[str, Value] = {}
        known: dict[str, object] = {}
        for name, default in _parameters(helper).items():
            if isinstance(default, ast.Constant):
                known[name] = default.value
        names = [a.arg for a in helper.args.posonlyargs + helper.args.args]
        passed = list(zip(names, call.args, strict=False)) + [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
        for name, arg in passed:
            bound[name] = outer.value(arg)
            known.pop(name, None)
            if isinstance(arg, ast.Constant):
                known[name] = arg.value
        inner = self._locals(hm, helper, bound)
        parents = self.parents(hm)
        for node in _own_nodes(helper):
            if isinstance(node, ast.Call) and hm.qualify(node.func) in _WARN and node.args:
                if condition(node, helper, parents, known) != Condition():
                    continue
                text = Renderer(hm, inner).text(node.args[0])
                if _DEPRECATION.search(text) and _warning_category(hm, node):
                    return text
        return None

    def _locals(self, m: Module, fn: ast.AST, env: dict[str, Value]) -> dict[str, Value]:
        """Simple local string assignments (`old_name = new_name[:-1]`), in source order."""
        env = dict(env)
        nodes = _own_nodes(fn)
        stores: dict[str, int] = {}
        for node in nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                stores[node.id] = stores.get(node.id, 0) + 1
        for name, count in stores.items():
            if count > 1:
                env.pop(name, None)  # set on several paths (`ret = "mean"` / `ret = "sum"`): unknown
        for node in sorted(nodes, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and stores.get(node.targets[0].id) == 1
            ):
                value = node.value
                if isinstance(value, ast.Call) and _dotted(value.func) and (_dotted(value.func) or "").endswith(".get"):
                    continue
                rendered = Renderer(m, env).value(value)
                if isinstance(rendered, Ref) or rendered != "{" + ast.unparse(value) + "}":
                    env[node.targets[0].id] = rendered  # known, at least in part
        return env

    def scan_module(self, m: Module) -> None:
        parents = self.parents(m)
        for node in ast.walk(m.tree):
            if isinstance(node, Function | ast.ClassDef):
                for d in node.decorator_list:
                    self._decorator(m, node, d, parents)
            if isinstance(node, Function):
                self._function(m, node, parents)
        for stmt in m.tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                self._factory(m, stmt.targets[0].id, stmt.value)
            elif isinstance(stmt, ast.ClassDef):
                self._inherited_init(m, stmt)
        for call, text, removed in self._warnings_in(m, m.tree):
            if condition(call, None, parents) == Condition():
                self.sites.append(Site(m.name, "", "module", text, removed))

    def qualname(self, m: Module, node: ast.AST) -> tuple[str, str] | None:
        """(dotted path in the module, kind) of a def or class; None inside functions."""
        parts = [node.name]  # type: ignore[attr-defined]
        parents = self.parents(m)
        current = parents.get(node)
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        while current is not None and not isinstance(current, ast.Module):
            if isinstance(current, Function):
                return None
            if isinstance(current, ast.ClassDef):
                parts.insert(0, current.name)
                if kind == "function":
                    kind = "method"
            current = parents.get(current)
        return ".".join(parts), kind

    def _target(self, m: Module, node: ast.AST) -> tuple[str, str, int] | None:
        """(qual, kind, positions to skip) a use of `node` is seen as: `__init__` -> the class."""
        found = self.qualname(m, node)
        if found is None:
            return None
        qual, kind = found
        head, _, last = qual.rpartition(".")
        if kind == "method" and last in ("__init__", "__new__"):
            return head, "class", 1
        if kind == "method" and last.startswith("__"):
            return None
        if kind == "method":
            method = node
            static = any(_dotted(d) in ("staticmethod", "classmethod") for d in method.decorator_list)  # type: ignore[attr-defined]
            return qual, kind, 0 if static else 1
        return qual, kind, 0

    def _decorator(self, m: Module, node: ast.AST, d: ast.expr, parents: dict[ast.AST, ast.AST]) -> None:
        if not (isinstance(d, ast.Call) and m.qualify(d.func) in _DEPRECATED_DECORATORS and d.args):
            return
        if any((_dotted(x) or "").endswith("overload") for x in node.decorator_list):  # type: ignore[attr-defined]
            return  # one deprecated overload (a deprecated argument value), not the function
        target = self._target(m, node)
        if target is None:
            return
        qual, kind, _ = target
        self.sites.append(Site(m.name, qual, kind, Renderer(m, {}).text(d.args[0])))

    def _function(self, m: Module, fn: Function, parents: dict[ast.AST, ast.AST]) -> None:
        target = self._target(m, fn)
        if target is None:
            return
        qual, kind, skip = target
        if fn.name == "__getattr__" and kind == "function":
            self._module_getattr(m, fn, parents)
            return
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        for c, text, removed in self.function_sites(m, fn):
            if c.when == "always":
                self.sites.append(Site(m.name, qual, kind, text, removed))
                continue
            for arg in c.arguments:
                position = params.index(arg) - skip if arg in params else -1
                self.sites.append(Site(m.name, qual, "argument", text, removed, arg, c.when, position))

    def function_sites(self, m: Module, fn: Function, depth: int = 0) -> list[tuple[Condition, str, bool]]:
        """(when, message, removed) for each deprecation warning a call of `fn` can raise: its own, and
        for an `__init__`, the argument warnings of the base `__init__` it hands its arguments to."""
        key = (m.name, id(fn))
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = []  # a cycle ends here
        parents = self.parents(m)
        found: list[tuple[Condition, str, bool]] = []
        for call, text, removed in self._warnings_in(m, fn):
            c = condition(call, fn, parents)
            if c is not None:
                found.append((c, text, removed))
        if fn.name == "__init__" and depth < 6:
            found += self._inherited(m, fn, parents, depth)
        self._memo[key] = found
        return found

    def _inherited(
        self, m: Module, fn: Function, parents: dict[ast.AST, ast.AST], depth: int
    ) -> list[tuple[Condition, str, bool]]:
        """`super().__init__(size_average, reduce, reduction)`: the base's argument warnings, renamed."""
        cls = parents.get(fn)
        if not isinstance(cls, ast.ClassDef) or not cls.bases:
            return []
        base = self.class_def(m, cls.bases[0])
        if base is None:
            return []
        bm, bcls = base
        init = next((s for s in bcls.body if isinstance(s, Function) and s.name == "__init__"), None)
        if init is None:
            return []
        own = set(_parameters(fn))
        out: list[tuple[Condition, str, bool]] = []
        for node in _own_nodes(fn):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "__init__"
                and isinstance(node.func.value, ast.Call)
                and _dotted(node.func.value.func) == "super"
                and condition(node, fn, parents) == Condition()
            ):
                continue
            names = [a.arg for a in init.args.posonlyargs + init.args.args][1:]  # after self
            passed = dict(zip(names, node.args, strict=False))
            passed.update({kw.arg: kw.value for kw in node.keywords if kw.arg})
            for c, text, removed in self.function_sites(bm, init, depth + 1):
                if c.when == "always":
                    continue
                mapped = tuple(
                    v.id for a in c.arguments if isinstance(v := passed.get(a), ast.Name) and v.id in own
                )
                if mapped and len(mapped) == len(c.arguments):
                    out.append((Condition(c.when, mapped), text, removed))
        return out

    def _inherited_init(self, m: Module, cls: ast.ClassDef) -> None:
        """`class MSELoss(_Loss)` without an `__init__`: constructing it runs the base's."""
        owner: tuple[Module, ast.ClassDef] | None = (m, cls)
        for _ in range(6):
            if owner is None:
                return
            bm, bcls = owner
            init = next((s for s in bcls.body if isinstance(s, Function) and s.name == "__init__"), None)
            if init is not None:
                break
            owner = self.class_def(bm, bcls.bases[0]) if bcls.bases else None
        else:
            return
        if bcls is cls:
            return  # its own __init__: seen by _function
        params = [a.arg for a in init.args.posonlyargs + init.args.args]
        for c, text, removed in self.function_sites(bm, init):
            if c.when == "always":
                self.sites.append(Site(m.name, cls.name, "class", text, removed))
                continue
            for arg in c.arguments:
                position = params.index(arg) - 1 if arg in params else -1
                self.sites.append(Site(m.name, cls.name, "argument", text, removed, arg, c.when, position))

    def class_def(self, m: Module, expr: ast.expr) -> tuple[Module, ast.ClassDef] | None:
        """The class a base-class expression names, in this module or another torch module."""
        if isinstance(expr, ast.Name):
            local = next((s for s in m.tree.body if isinstance(s, ast.ClassDef) and s.name == expr.id), None)
            if local is not None:
                return m, local
        q = m.qualify(expr)
        if not q or not q.startswith("torch."):
            return None
        module, _, name = q.rpartition(".")
        for path in (
            self.root.parent / (module.replace(".", "/") + ".py"),
            self.root.parent / module.replace(".", "/") / "__init__.py",
        ):
            if path.exists():
                target = self.load(path)
                if target is None:
                    return None
                found = next((s for s in target.tree.body if isinstance(s, ast.ClassDef) and s.name == name), None)
                if found is not None:
                    return target, found
                source = target.imports.get(name)  # re-exported: follow one import
                if source and source != q:
                    return self.class_def(target, ast.parse(source, mode="eval").body)  # type: ignore[arg-type]
        return None

    def _factory(self, m: Module, name: str, value: ast.expr) -> None:
        """`current_device_idx = deprecated("...")(current_device_index)` and
        `uniform = _make_deprecate(uniform_)` (a factory whose returned function warns)."""
        if not isinstance(value, ast.Call):
            return
        func = value.func
        if isinstance(func, ast.Call) and m.qualify(func.func) in _DEPRECATED_DECORATORS and func.args:
            self.sites.append(Site(m.name, name, "function", Renderer(m, {}).text(func.args[0])))
            return
        factory = m.functions.get(func.id) if isinstance(func, ast.Name) else None
        if factory is None:
            return
        bound: dict[str, Value] = {}
        for param, arg in zip([a.arg for a in factory.args.args], value.args, strict=False):
            d = _dotted(arg)
            bound[param] = Ref(d) if d else Renderer(m, {}).value(arg)
        env = self._locals(m, factory, bound)
        parents = self.parents(m)
        returned = {_dotted(n.value) for n in _own_nodes(factory) if isinstance(n, ast.Return) and n.value}
        for inner in factory.body:
            if isinstance(inner, Function) and inner.name in returned:
                for node in _own_nodes(inner):
                    if isinstance(node, ast.Call) and m.qualify(node.func) in _WARN and node.args:
                        text = Renderer(m, self._locals(m, inner, env)).text(node.args[0])
                        if (
                            _DEPRECATION.search(text)
                            and _warning_category(m, node)
                            and condition(node, inner, parents) == Condition()
                        ):
                            self.sites.append(Site(m.name, name, "function", text))
                            return

    def _module_getattr(self, m: Module, fn: Function, parents: dict[ast.AST, ast.AST]) -> None:
        """A module `__getattr__(name)` that warns for some names: `name == "x"` or a table of them."""
        param = (fn.args.posonlyargs + fn.args.args)[0].arg if fn.args.args or fn.args.posonlyargs else None
        if param is None:
            return
        lookups: dict[str, str] = {}  # local bound to TABLE.get(name) -> TABLE
        for node in _own_nodes(fn):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "get"
                and isinstance(node.value.func.value, ast.Name)
                and node.value.args
                and isinstance(node.value.args[0], ast.Name)
                and node.value.args[0].id == param
            ):
                lookups[node.targets[0].id] = node.value.func.value.id
        for node in _own_nodes(fn):
            if not (isinstance(node, ast.Call) and m.qualify(node.func) in _WARN and node.args):
                continue
            for key, bound in self._getattr_names(m, node, fn, param, lookups, parents):
                env = {param: key, **bound}
                text = Renderer(m, env).text(node.args[0])
                if _DEPRECATION.search(text) and _warning_category(m, node):
                    self.sites.append(Site(m.name, key, "attribute", text))

    def _getattr_names(
        self, m: Module, call: ast.Call, fn: Function, param: str, lookups: dict[str, str],
        parents: dict[ast.AST, ast.AST],
    ) -> list[tuple[str, dict[str, Value]]]:
        current = parents.get(call)
        while current is not None and current is not fn:
            if isinstance(current, ast.If):
                test = current.test
                if (
                    isinstance(test, ast.Compare)
                    and isinstance(test.left, ast.Name)
                    and test.left.id == param
                    and isinstance(test.ops[0], ast.Eq)
                    and isinstance(test.comparators[0], ast.Constant)
                    and isinstance(test.comparators[0].value, str)
                ):
                    return [(test.comparators[0].value, {})]
                names = _names(test) & set(lookups)
                if len(names) == 1:
                    local = names.pop()
                    table = m.consts.get(lookups[local])
                    if isinstance(table, ast.Dict):
                        out = []
                        for k, v in zip(table.keys, table.values, strict=True):
                            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                                d = m.qualify(v)
                                out.append((k.value, {local: Ref(d)} if d else {}))
                        return out
            current = parents.get(current)
        return []

    # -- public names --------------------------------------------------------------------------

    def public_names(self, module: str, name: str, seen: set[tuple[str, str]] | None = None) -> set[str]:
        """Every public dotted name `module.name` is reachable by (re-exports followed)."""
        seen = set() if seen is None else seen
        if (module, name) in seen:
            return set()
        seen.add((module, name))
        found = {f"{module}.{name}"} if _is_public(module) and not name.startswith("_") else set()
        for m in self.modules.values():
            for alias, source, original, explicit in m.reexports:
                if source != module or original != name or alias.startswith("_"):
                    continue
                # A package's imports from inside itself are its API; other imports only when the
                # module says so (__all__, `as y`): `from torch import Tensor` re-exports nothing.
                inside = m.package and source.startswith(m.name + ".")
                if inside or explicit or (m.all is not None and alias in m.all):
                    found |= self.public_names(m.name, alias, seen)
            if module in m.stars and not name.startswith("_"):
                exported = self.modules.get(module)
                if exported is None or exported.all is None or name in exported.all:
                    found |= self.public_names(m.name, name, seen)
        return found


# a function's own nodes are asked for by several passes over the same tree: worked out once per function
_own_nodes = cache(own_nodes)


def _warning_category(m: Module, call: ast.Call) -> bool:
    """Whether a warnings.warn call warns (any Warning class; no category means UserWarning)."""
    category = call.args[1] if len(call.args) > 1 else next(
        (kw.value for kw in call.keywords if kw.arg == "category"), None
    )
    if category is None:
        return True
    name = _dotted(category) or ""
    return name.endswith("Warning")


# -- what the message says ---------------------------------------------------------------------

_TRIGGER = re.compile(
    r"(?:please\s+use|please\s+switch\s+to|use|using|in\s+favou?r\s+of|switch\s+to|replaced\s+(?:by|with)|"
    r"renamed\s+to|migrate\s+to|moved\s+to)\s+(?:the\s+|a\s+|an\s+)?",
    re.I,
)
_CODE = re.compile(
    r"`{1,2}([^`]+)`{1,2}|'([^'\s][^']*)'|\"([^\"\s][^\"]*)\"|([A-Za-z_][\w.]*(?:\([^)]*\)|='[^']*'|=\"[^\"]*\")?)"
)
_SINCE = re.compile(r"deprecated\s+(?:since|in|as\s+of)\s+(?:pytorch\s+|torch\s+|version\s+|v)?(\d+\.\d+)", re.I)
_SINCE_ALONE = re.compile(r"\bsince\s+(?:pytorch\s+|torch\s+|version\s+|v)(\d+\.\d+)", re.I)


def replacement(message: str, old: str) -> str:
    """The name a deprecation message asks for instead (`use X instead`, `in favor of X`), or ''."""
    for trigger in _TRIGGER.finditer(message):
        m = _CODE.match(message, trigger.end())
        if m is None:
            continue
        quoted = next((g for g in m.groups()[:3] if g), None)
        code = (quoted or m.group(4) or "").strip().rstrip(".,;:")
        if not code or code.split("(")[0] in (old, old.rpartition(".")[2]):
            continue
        if quoted is None and not re.search(r"[._(=]", code):
            continue  # "use kwargs instead": prose, not a name
        return code
    return ""


def since(message: str) -> str:
    m = _SINCE.search(message) or _SINCE_ALONE.search(message)
    return m.group(1) if m else ""


def _trim(message: str) -> str:
    """One line; what the source computes at run time (`{ret}`) shown as `...`."""
    message = re.sub(r"\{[^{}\s]*\}", "...", message)
    return re.sub(r"\s+", " ", message).strip()


# -- the table ---------------------------------------------------------------------------------


def build(root: Path) -> dict[str, object]:
    scanner = Scanner(root)
    scanner.scan()
    entries: dict[tuple[str, str], dict[str, object]] = {}
    for site in scanner.sites:
        if site.kind == "module":
            names = {site.module} if _is_public(site.module) else set()
        else:
            head, _, rest = site.qual.partition(".")
            names = {n + (f".{rest}" if rest else "") for n in scanner.public_names(site.module, head)}
        defined = f"{site.module}.{site.qual}".rstrip(".")
        for name in sorted(n for n in names if _is_public(n)):
            key = (name, site.argument)
            message = _trim(site.message)
            if key in entries:
                continue
            entry: dict[str, object] = {"name": name, "kind": site.kind}
            if site.argument:
                entry["argument"] = site.argument
                entry["when"] = site.when
                entry["position"] = site.position
            if site.removed:
                entry["removed"] = True
            entry["replacement"] = replacement(message, name)
            entry["since"] = since(message)
            entry["message"] = message
            entry["defined"] = defined
            entries[key] = entry
    return {"torch": torch_version(root), "deprecated": [entries[k] for k in sorted(entries)]}


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v), ensure_ascii=True)  # a JSON string is a valid TOML basic string


def generator_digest() -> str:
    """What the table is a function of, besides torch's source: this module's own code."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def entries_digest(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def render_toml(table: dict[str, object]) -> str:
    body: list[str] = []
    for entry in table["deprecated"]:  # type: ignore[attr-defined]
        body += ["", "[[deprecated]]"]
        body += [f"{k} = {_toml_value(v)}" for k, v in entry.items() if v != ""]
    text = "\n".join(body) + "\n"
    # The two digests let the test skip a minute of regeneration when neither torch, nor this generator,
    # nor the entries changed since the last run (tests/test_deprecations.py).
    head = [
        "# Deprecated and removed torch names, generated from the installed torch's source by",
        "#     python -m torchdoctor.rules.static.deprecations",
        "# Do not edit by hand: regenerate (tests/test_deprecations.py compares this file with a fresh run).",
        f"torch = {_toml_value(table['torch'])}",
        f"generator = {_toml_value(generator_digest())}",
        f"entries = {_toml_value(entries_digest(text))}",
    ]
    return "\n".join(head) + "\n" + text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchdoctor.rules.static.deprecations", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).parents[1] / "data" / "deprecated.toml"))
    parser.add_argument("--torch-dir", default=None, help="the torch package folder (default: the installed torch)")
    args = parser.parse_args(argv)
    root = Path(args.torch_dir) if args.torch_dir else torch_dir()
    if not (root / "__init__.py").exists():
        print(f"error: {root} is not a torch package folder", file=sys.stderr)
        return 2
    table = build(root)
    try:
        Path(args.out).write_text(render_toml(table), encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"{len(table['deprecated'])} entries from torch {table['torch']} -> {args.out}")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TD608 (debugging family) — a torch name or argument that torch itself marks deprecated or removed.

The table is data generated from the installed torch's source (rules/data/deprecated.toml, written by
`python -m torchdoctor.rules.static.deprecations`); nothing here imports torch. Docs: deprecated_api.toml.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from itertools import compress
from operator import attrgetter
from typing import Any

from torchdoctor.rules.catalog import load_toml
from torchdoctor.rules.static.api import Context, rule
from torchdoctor.rules.static.index import canonical, dotted

# -- TD608 -------------------------------------------------------------------------------------

# Entries TD401 reports (with its own advice on torch.amp), left out here so a use is reported once.
_COVERED_BY_TD401 = ("torch.cuda.amp.", "torch.cpu.amp.")


@dataclass(frozen=True)
class _Deprecations:
    names: dict[str, dict[str, Any]]  # qualified name -> entry (a deprecated or removed name)
    arguments: dict[str, list[dict[str, Any]]]  # qualified callable -> entries for its arguments
    torch: tuple[int, int] | None  # the torch the table was generated from


@cache
def deprecations() -> _Deprecations:
    """rules/data/deprecated.toml (generated from torch's source by rules/static/deprecations.py)."""
    data = load_toml("deprecated.toml")
    names: dict[str, dict[str, Any]] = {}
    arguments: dict[str, list[dict[str, Any]]] = {}
    for entry in data.get("deprecated", []):
        name = canonical(entry["name"])
        if name.startswith(_COVERED_BY_TD401):
            continue
        if entry.get("kind") == "argument":
            arguments.setdefault(name, []).append(entry)
        else:
            names.setdefault(name, entry)
    m = re.match(r"(\d+)\.(\d+)", str(data.get("torch", "")))
    return _Deprecations(names, arguments, (int(m.group(1)), int(m.group(2))) if m else None)


def _applies(ctx: Context, table: _Deprecations, entry: dict[str, Any]) -> bool:
    """Whether the targeted torch has the deprecation: by the version the message gives, else only
    when the target is at least the torch the table comes from (an older one may not warn yet)."""
    since = re.match(r"(\d+)\.(\d+)", entry.get("since", ""))
    if since:
        return ctx.torch_at_least(int(since.group(1)), int(since.group(2)))
    return table.torch is None or ctx.torch_at_least(*table.torch)


def _maybe_none(index: Any, call: ast.Call, value: ast.expr) -> bool:
    """A value forwarded from somewhere that may hold None: `size_average=size_average` inside a wrapper
    whose own parameter defaults to None, or `reduce=self.reduce` (torch warns only when it is not None)."""
    if isinstance(value, ast.Attribute):
        return _attribute_maybe_none(index, call, value)
    if not isinstance(value, ast.Name):
        return False
    fn = index.function_of(call)
    if fn is None:
        return False
    return _parameter_default_is_none(fn, value.id)


def _attribute_maybe_none(index: Any, call: ast.Call, value: ast.Attribute) -> bool:
    """`self.size_average`, known not None only when every `self.size_average = ...` in the class is a
    constant other than None or an `__init__` parameter whose default is one."""
    info = index.class_of(call)
    if info is None or not (isinstance(value.value, ast.Name) and value.value.id == "self"):
        return True
    sets = [a for a in index.self_assignments(info, None) if a.attr == value.attr]
    if not sets:
        return True
    for a in sets:
        v = a.value
        if isinstance(v, ast.Constant):
            if v.value is None:
                return True
        elif not (isinstance(v, ast.Name) and _parameter_default(a.method, v.id) not in (None, _NONE)):
            return True
    return False


_NONE = object()  # a parameter whose default is None


def _parameter_default(fn: ast.AST, name: str) -> object:
    """The constant default of a parameter: its value, _NONE for None, None when unknown or absent."""
    args = fn.args  # type: ignore[attr-defined]
    positional = args.posonlyargs + args.args
    named = [a.arg for a in positional[len(positional) - len(args.defaults):]]
    defaults = dict(zip(named, args.defaults, strict=True))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
    d = defaults.get(name)
    if not isinstance(d, ast.Constant):
        return None
    return _NONE if d.value is None else d.value


def _parameter_default_is_none(fn: ast.AST, name: str) -> bool:
    return _parameter_default(fn, name) is _NONE


def _argument_used(call: ast.Call, entry: dict[str, Any], index: Any = None) -> bool | None:
    """True when the call gives the argument a value (any but None; a true one for `set`), False when
    it leaves it out or passes None, None when `*args` / `**kwargs` hide the answer."""
    name, position = entry["argument"], int(entry.get("position", -1))
    value: ast.expr | None = None
    for kw in call.keywords:
        if kw.arg == name:
            value = kw.value
        elif kw.arg is None and value is None:
            return None
    if value is None:
        if any(isinstance(a, ast.Starred) for a in call.args):
            return None
        if 0 <= position < len(call.args):
            value = call.args[position]
    if value is None:
        return False
    if index is not None and _maybe_none(index, call, value):
        return None
    if entry.get("when") == "set" and not isinstance(value, ast.Constant):
        return None  # warns only for a true value, and this one is not known
    if isinstance(value, ast.Constant):
        # `dim=0` gives dim; only None stands for "not given" (and a false value for `set`).
        return value.value is not None and (entry.get("when") != "set" or bool(value.value))
    return True


def _deprecation_values(ctx: Context, table: _Deprecations, where: ast.AST, q: str, entry: dict[str, Any]) -> dict:
    shown = ctx.segment(where, 60)
    replacement = entry.get("replacement", "")
    argument = entry.get("argument", "")
    since = f" since torch {entry['since']}" if entry.get("since") else ""
    if argument:
        state = (
            f"leaves out `{argument}`, which is deprecated{since}" if entry.get("when") == "omitted"
            else f"passes `{argument}`, deprecated{since}"
        )
    elif entry.get("removed"):
        state = f"was removed (deprecated{since}; the name only raises an error now)"
    else:
        state = f"is deprecated{since}"
    version = ".".join(map(str, table.torch)) if table.torch else "the installed torch"
    warning = entry.get("message", "")
    if len(warning) > 160:
        warning = warning[:157].rstrip() + "..."
    return {
        "variable": shown,
        "via": "" if q in (shown, f"{shown}()") or not q else f" (`{q}`)",
        "state": state,
        "torch": version,
        "instead": f"; use `{replacement}`" if replacement else "",
        "warning": warning,
        "name": q,
        "replacement": replacement,
        "advice": f"use `{replacement}` as torch's warning says" if replacement
        else "follow torch's warning",
    }


def _one_class(index: Any, expr: ast.expr) -> str | None:
    """The class every binding of this name in the file agrees on (`scheduler = ReduceLROnPlateau(...)`
    in one branch and `MultiStepLR(...)` in another: no answer)."""
    name = dotted(expr)
    found = index.bindings.get(name or "", [])
    classes = {b.cls for b in found}
    if len(classes) != 1 or any(b.guessed for b in found):
        return None
    return classes.pop()


@cache
def _last_names() -> frozenset[str]:
    """The last part of every deprecated name (`autocast`, `_LRScheduler`): a use whose dotted name ends otherwise
    is not one of them."""
    return frozenset(q.rsplit(".", 1)[-1] for q in deprecations().names)


@cache
def _argument_methods() -> frozenset[str]:
    """The method names with a deprecated argument (`step` of a scheduler): only calls of these need the class of
    the object they are called on, a lookup most method calls of a file would otherwise pay."""
    return frozenset(q.rsplit(".", 1)[-1] for q in deprecations().arguments)


@cache
def _argument_callees() -> frozenset[str]:
    """The qualified callees with a deprecated argument: the calls index hands over their calls (and those of
    `_argument_methods`) in the walk's order, so the file's other calls are never looked at."""
    return frozenset(q for q, entries in deprecations().arguments.items() if entries)


_ID = attrgetter("id")


@rule("TD608", ast.Module, reads=(ast.Name, ast.Call))
def deprecated_torch_api(node: ast.AST, ctx: Context) -> None:
    # One loop per file over the walk's buckets, not a call per node: most names of a file are locals, and
    # a function call for each of them was the largest single cost of `check` on torch's own tree.
    table = deprecations()
    index = ctx.index
    attribute_cls = ast.Attribute
    for call in index.calls_named(_argument_callees(), _argument_methods()):
        _deprecated_argument(call, ctx, table)  # type: ignore[arg-type]
    roots = set(index.aliases) | set(index.vocab["conventional_aliases"])
    if not roots:
        return
    # Only the longest dotted name of a chain is asked (`torch.jit.script`, not `torch.jit`): from each imported
    # root name up to the outermost attribute over it. Chains rooted in a local name (most of a file) are never
    # visited, and no chain is walked down once per attribute.
    load_cls = ast.Load
    parents = index.parents
    last_names = _last_names()
    conventional = index.vocab["conventional_aliases"]
    found: list[ast.AST] = []
    # a local name (most of a file) has nothing imported to resolve: the names are filtered in C (the file's most
    # numerous node, a Python-level test of each cost as much as the rest of the rule)
    names = index.nodes(ast.Name)
    for name in compress(names, map(roots.__contains__, map(_ID, names))):
        used = name
        parent = parents.get(used)
        while parent.__class__ is attribute_cls:
            used, parent = parent, parents.get(parent)
        # the qualified name ends as the code spells it (`canonical` keeps the last part), so a chain whose last
        # part no deprecated name has cannot be one: `torch.tensor`, `nn.Linear` need no lookup
        last = used.attr if used is not name else (index.aliases.get(name.id) or conventional.get(name.id) or "")  # type: ignore[attr-defined]
        if last.rpartition(".")[2] not in last_names:
            continue
        if used.ctx.__class__ is load_cls:  # type: ignore[attr-defined]
            found.append(used)
    # names first, then attributes, each in source order: the order the findings were always made in
    found.sort(key=lambda n: n.__class__ is attribute_cls)
    for used in found:
        _deprecated_name(used, ctx, table)


def _deprecated_argument(node: ast.Call, ctx: Context, table: _Deprecations) -> None:
    index = ctx.index
    q = index.callee(node)
    entries = table.arguments.get(q or "", [])
    if not entries and isinstance(node.func, ast.Attribute) and node.func.attr in _argument_methods():
        # `scheduler.step(epoch)`: the method of the object's class, when the index knows the class.
        cls = _one_class(index, node.func.value)
        if cls:
            q = f"{cls}.{node.func.attr}"
            entries = table.arguments.get(q, [])
    for entry in entries:
        used = _argument_used(node, entry, index)
        wanted = entry.get("when") != "omitted"
        if used is not None and used == wanted and _applies(ctx, table, entry):
            ctx.report(node, **_deprecation_values(ctx, table, node.func, q or "", entry))
            return


def _deprecated_name(node: ast.AST, ctx: Context, table: _Deprecations) -> None:
    index = ctx.index
    parent = index.parent(node)
    if isinstance(parent, ast.Attribute) and parent.value is node:
        return  # `torch.jit` in `torch.jit.script`: the longest name is the one used
    if isinstance(parent, ast.Dict | ast.List | ast.Tuple | ast.Set | ast.Compare):
        return  # listed or compared, not called: e.g. a table of every init function to patch
    q = index.resolve(node)
    entry = table.names.get(q or "")
    if entry is None or not _applies(ctx, table, entry):
        return
    ctx.report(node, **_deprecation_values(ctx, table, node, q or "", entry))

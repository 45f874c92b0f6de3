"""Call context across files: what the callers of a function settle for it.

A rule that would report inside a function nobody in its own file calls (`def evaluate(model, loader)` running the
model with autograd on) asks instead: does every call of it in the project run under `no_grad`, after `.eval()`,
on the main process only? The file defers the finding with `defer(ctx, node, fn, under, values)`; every file leaves
its call sites once (`leave_sites`, from semantic/callsites.py); the rule's `@project` pass calls `settle`, which
keeps a deferred finding unless every known call site agrees. No call site known: the finding stays, as a
one-file analysis would have reported it.

Sites are matched to a function by what the call names: an imported name or module path that resolves to the
defining module (`from engine import evaluate`, `engine.evaluate(...)`), else by the bare name, and a method by its
name on any object. An unrelated call of the same name only adds a site that may disagree, which keeps the finding.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from torchdoctor.rules.static.api import Context
from torchdoctor.rules.static.project import Project, ProjectFile, ProjectHit
from torchdoctor.rules.static.semantic.callsites import function_identity
from torchdoctor.rules.static.semantic.subtree import subtree

SITES = "call-sites"


@dataclass(frozen=True)
class Site:
    """The calls one file makes of one callee, as one: what they all share is all the pass asks."""

    path: str  # display path of the calling file
    callee: str | None  # the qualified name the calls resolve to, when they name an import
    context: frozenset[str]  # the words every one of those calls carries


def leave_sites(ctx: Context) -> None:
    """This file's call sites, once per file whichever rule asks first."""
    def build() -> bool:
        sites = ctx.index.call_sites()
        if sites:
            ctx.leave(SITES, sites)
        return True
    ctx.memo(SITES, build)


def defer(ctx: Context, node: ast.AST, fn: ast.AST, under: str, values: dict[str, Any], key: str) -> None:
    """A finding at `node` that stands unless every call of `fn` in the project runs `under` a context word."""
    leave_sites(ctx)
    cls, name = function_identity(ctx.index, fn)
    if _referenced_here(ctx.index.tree, name):
        ctx.report(node, **values)  # handed to something as a value in its own file: that caller is unknown
        return
    ctx.leave(key, {"class": cls, "function": name, "under": under, "line": node.lineno,  # type: ignore[attr-defined]
                    "col": node.col_offset + 1, "values": values})  # type: ignore[attr-defined]


def _referenced_here(tree: ast.AST, name: str) -> bool:
    """The function's name read as a value in its own file (`callbacks=[self.validate]`, `pool.map(evaluate, ...)`),
    not called: it runs where this file hands it. A walk of the file, made only for a finding about to be deferred."""
    calls = {id(n.func) for n in subtree(tree) if isinstance(n, ast.Call)}
    for n in subtree(tree):
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) and id(n) not in calls:
            return True
        if isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.ctx, ast.Load) and id(n) not in calls:
            return True
    return False


class CallContext:
    """The project's call sites by the name they call."""

    def __init__(self, project: Project):
        self.project = project
        self._by_name: dict[str, list[Site]] = {}
        for f, table in project.facts(SITES):
            for name, rows in table.items():
                for q, words in rows:
                    self._by_name.setdefault(name, []).append(Site(f.path, q, frozenset(words)))

    def sites(self, defined_in: ProjectFile, function: str, cls: str | None = None) -> list[Site]:
        """The calls that may run `function` (a method of `cls` when given) defined in `defined_in`."""
        out = []
        for site in self._by_name.get(function, ()):
            if cls is None and site.callee is not None and "." in site.callee:
                owners = self.project.defining(site.callee)
                if owners and all(g.path != defined_in.path for g, _ in owners):
                    continue  # an import of another module's function of the same name
            out.append(site)
        return out

    def callers_all(self, defined_in: ProjectFile, function: str, under: str, cls: str | None = None) -> bool | None:
        """True when every known call of the function runs `under` the context word, False when one does not,
        None when no call is known."""
        sites = self.sites(defined_in, function, cls)
        if not sites:
            return None
        return all(under in s.context for s in sites)


    def callers_any(self, defined_in: ProjectFile, function: str, under: str, cls: str | None = None) -> bool:
        """True when some known call of the function runs `under` the context word."""
        return any(under in s.context for s in self.sites(defined_in, function, cls))


def call_context(project: Project) -> CallContext:
    """The project's call sites by name, joined once for the four rules that ask them (TD102, TD303, TD601, TD703)."""
    return project.memo(SITES, lambda: CallContext(project))


def settle(project: Project, key: str) -> list[ProjectHit]:
    """The deferred findings (`defer(..., key=key)`) that some call site, or the lack of any, leaves standing."""
    pending = list(project.facts(key))
    if not pending:
        return []
    context = call_context(project)
    hits = []
    for f, fact in pending:
        if context.callers_all(f, fact["function"], fact["under"], fact["class"]):
            continue
        hits.append(ProjectHit(f.path, fact["line"], fact["col"], fact["values"]))
    return hits

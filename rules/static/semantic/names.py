"""What a name refers to: import aliases resolved to qualified names, and calls indexed by callee."""

from __future__ import annotations

import ast
from bisect import bisect_left
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.syntax import (
    dotted,
    stmt_position,
)
from torchdoctor.rules.static.semantic.vocabulary import canonical

if TYPE_CHECKING:
    pass


_UNKNOWN = object()  # `resolve`'s cache: not asked yet (None is an answer)


class Names:
    """Qualified names through import aliases; calls by qualified name and by method."""

    def resolve(self, expr: ast.AST | None) -> str | None:
        """The qualified name of an imported object: `F.softmax` -> `torch.nn.functional.softmax`. Kept per node:
        rules ask it of the same callee many times, and the imports it reads are final once the index is built."""
        known = self._resolved.get(expr, _UNKNOWN)
        if known is not _UNKNOWN:
            return known  # type: ignore[return-value]
        found = self._resolved[expr] = self._qualified(dotted(expr))
        return found

    def _qualified(self, name: str | None) -> str | None:
        """`resolve` of an expression whose dotted name is `name`."""
        if name is None:
            return None
        root, _, rest = name.partition(".")
        base = self.aliases.get(root)
        if base is None:
            base = self.vocab["conventional_aliases"].get(root)
        return canonical(f"{base}.{rest}" if rest else base) if base is not None else None

    def class_choices(self, func: ast.AST) -> list[str]:
        """The qualified classes a call may build: the imported class itself, or, for a local name bound once to
        a choice of classes (`train_sampler = RandomSampler if args.local_rank == -1 else DistributedSampler`,
        then `train_sampler(dataset)`), each of them."""
        q = self.resolve(func)
        if q is not None:
            return [q]
        if not isinstance(func, ast.Name):
            return []
        values = self.definitions(func.id, func)  # type: ignore[attr-defined]
        if len(values) != 1:
            return []
        out: list[str] = []
        pending = [values[0]]
        while pending and len(out) < 8:
            v = pending.pop()
            if isinstance(v, ast.IfExp):
                pending += [v.body, v.orelse]
            elif isinstance(v, ast.Name | ast.Attribute) and (r := self.resolve(v)) is not None:
                out.append(r)
        return out

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
        return sorted(found, key=stmt_position) if len(names) > 1 else found

    def calls_named(self, callees: frozenset[str], methods: frozenset[str]) -> list[ast.Call]:
        """The calls of these qualified callees (`callee`) or method names, in the walk's order: the calls, and the
        order, a check subscribed to every call meets them in (the engine's `callees=`/`methods=` narrowing)."""
        by_name, by_method = self.calls_by_name, self.calls_by_method
        found = [by_name[n] for n in callees if n in by_name] if len(callees) < len(by_name) else [
            calls for n, calls in by_name.items() if n in callees]
        found += [by_method[m] for m in methods if m in by_method]
        if not found:
            return []
        if len(found) == 1:
            return found[0]
        if self._call_order is None:
            self._call_order = {call: i for i, call in enumerate(self.nodes(ast.Call))}
        return sorted({call for calls in found for call in calls}, key=self._call_order.__getitem__)

    def method_calls(self, method: str) -> list[ast.Call]:
        """Every `<expr>.method(...)` call, in source order."""
        return self.calls_by_method.get(method, [])

    def uses(self, prefix: str) -> bool:
        """Whether the file imports or calls anything under a qualified prefix."""
        if self._used_prefixes is None:
            # Every name imported or called, as a set and sorted, once per file: the router's contexts and the
            # framework lookups ask several prefixes of every file. A prefix is used when it is one of the names or
            # some name starts with it and a dot, and the names that do sit together in sorted order, so each
            # question is one binary search (a table of every dotted prefix of every name cost more to build than
            # all the questions asked of it). Both sources are final once the calls are indexed (`_index_calls`).
            names = {*self.imported, *self.calls_by_name}
            self._used_prefixes = (frozenset(names), sorted(names))
        known, ordered = self._used_prefixes
        if prefix in known:
            return True
        under = prefix + "."
        at = bisect_left(ordered, under)
        return at < len(ordered) and ordered[at].startswith(under)

    def _build_names(self) -> None:
        """Import aliases, then every call indexed by qualified callee and by method name."""
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

    def _index_calls(self) -> None:
        # `callee`'s cache filled here without its lookup: every call is new to it, and a missed lookup costs
        # an exception each. So is `resolve`'s, from the one dotted name `callee` falls back to.
        # A file calls the same spellings over and over (`torch.cat`, `self.conv`): each is qualified once.
        known, resolved = self._callee, self._resolved
        qualified: dict[str | None, str | None] = {}
        for node in self.nodes(ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                self.calls_by_method.setdefault(func.attr, []).append(node)
            if node in known:
                name = known[node]
            else:
                name = resolved.get(func, _UNKNOWN)
                spelled = dotted(func)
                if name is _UNKNOWN:
                    name = qualified.get(spelled, _UNKNOWN)
                    if name is _UNKNOWN:
                        name = qualified[spelled] = self._qualified(spelled)
                    resolved[func] = name
                if name is None:
                    name = spelled
                known[node] = name
            if name is not None:
                self.calls_by_name.setdefault(name, []).append(node)

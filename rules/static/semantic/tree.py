"""Where a node sits: its parent, ancestors, scope, function and statement."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.syntax import (
    FUNCTIONS,
    SCOPES,
)

if TYPE_CHECKING:
    pass


class Tree:
    """Navigation in the parsed tree (the walk recorded every node's parent)."""

    def nodes(self, kind: type[ast.AST]) -> list[ast.AST]:
        bucket = self.buckets.get(kind)
        if bucket is None:
            # A kind no enabled rule declared in `reads=`: collect it now, in the walk's order. A missing
            # declaration then costs one more pass instead of a silently empty answer (a helper shared by
            # several rules is easy to call from a rule that did not declare what the helper reads).
            from torchdoctor.rules.static.engine import walk  # the engine imports the index: import at use

            bucket = self.buckets[kind] = walk(self.tree, (kind,))[0][kind]
        return bucket

    def binops(self, ops: tuple[type[ast.operator], ...]) -> list[ast.AST]:
        """The file's BinOps of these operators, in the walk's order: grouped by operator on the first question,
        so a rule that reads only `a / b` is never called on the file's every `+` (the engine's `ops=` narrowing)."""
        if self._binops is None:
            self._binops = {}
            for node in self.nodes(ast.BinOp):
                self._binops.setdefault(node.op.__class__, []).append(node)  # type: ignore[attr-defined]
        if len(ops) == 1:
            return self._binops.get(ops[0], [])
        found = [node for op in ops for node in self._binops.get(op, ())]
        order = {id(node): i for i, node in enumerate(self.nodes(ast.BinOp))} if len(found) > 1 else {}
        return sorted(found, key=lambda node: order[id(node)])

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

    def statement_of(self, node: ast.AST) -> ast.stmt | None:
        current: ast.AST | None = node
        while current is not None and not isinstance(current, ast.stmt):
            current = self.parents.get(current)
        return current

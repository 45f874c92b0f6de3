"""Classes of the file: nn.Module and autograd.Function subclasses, their methods and `self.x` attributes."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import (
    FUNCTIONS,
    dotted,
    stmt_position,
)

if TYPE_CHECKING:
    from torchdoctor.rules.static.semantic.classes import ClassInfo


@dataclass
class ClassInfo:
    node: ast.ClassDef
    bases: list[str]
    is_module: bool = False
    is_function: bool = False  # a torch.autograd.Function subclass

    @property
    def name(self) -> str:
        return self.node.name

    # the methods by name, read off the class body once: rules ask `method(...)` of every `self.x(...)` call, and
    # building the table each time was about 1 % of `check` over torch's tree (the tree is never changed)
    _methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] | None = field(
        default=None, init=False, repr=False, compare=False)

    @property
    def methods(self) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        found = self._methods
        if found is None:
            found = self._methods = {s.name: s for s in self.node.body if isinstance(s, FUNCTIONS)}
        return found

    def method(self, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        return self.methods.get(name)

@dataclass
class SelfAssign:
    attr: str
    value: ast.expr
    stmt: ast.stmt
    method: ast.FunctionDef | ast.AsyncFunctionDef

class Classes:
    """Module and Function classes, the method holding a node, self attributes."""

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

    def _build_classes(self) -> None:
        defs = sorted(self.nodes(ast.ClassDef), key=stmt_position)
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
            if not info.is_module and self.project is not None:
                # `class GPT(BaseModel)` with `BaseModel(nn.Module)` in another file of the project
                info.is_module = any(self.project.is_module_class(b) or self.star_imports
                                     and self.project.star_module_class(self.star_imports, b) for b in bases if b)
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
            for stmt in self.assignments_in_order():  # type: ignore[attr-defined]
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
            for node in subtree(fn):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Load)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    reads.setdefault(node.attr, []).append(node)
        return reads

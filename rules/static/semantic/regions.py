"""Regions of code with a mode: autograd disabled (no_grad, inference_mode, set_grad_enabled) and autocast."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import (
    FUNCTIONS,
    WITHS,
    is_constant,
    kwarg,
    last_name,
)

if TYPE_CHECKING:
    from torchdoctor.rules.static.semantic.regions import AutocastRegion

# A project's own wrapper of torch.no_grad / inference_mode, read by its name (the wrapper may sit in another
# file): `smart_inference_mode`, `no_grad_if_eval`, `maybe_inference_mode`.
_GRAD_OFF_NAME = re.compile(r"no_grad|inference_mode")


@dataclass
class AutocastRegion:
    node: ast.AST  # the With statement or the decorated function
    call: ast.Call | None
    device: str | None  # "cuda" | "cpu" | None (unknown)
    dtype: str | None  # "float16" | "bfloat16" | None (unknown)

def _dtype_name(q: str | None) -> str | None:
    return {
        "torch.float16": "float16",
        "torch.half": "float16",
        "torch.bfloat16": "bfloat16",
        "torch.float32": "float32",
        "torch.float": "float32",
    }.get(q or "")

class Regions:
    """Whether autograd is off at a node, and the autocast region around it."""

    def _is_grad_off(self, expr: ast.AST) -> bool:
        """A context manager / decorator expression that disables autograd (or might: conditional)."""
        if isinstance(expr, ast.IfExp):
            return self._is_grad_off(expr.body) or self._is_grad_off(expr.orelse)
        if isinstance(expr, ast.Name | ast.Attribute):
            q = self.resolve(expr)
            if q in self.names["no_grad"]:
                return True  # bare decorator `@torch.no_grad`
            if _GRAD_OFF_NAME.search(last_name(expr) or "") and not (q or "").startswith("torch."):
                return True  # the project's own wrapper: `@smart_inference_mode`, `with maybe_no_grad:`
            if isinstance(expr, ast.Name) and self._wraps_in_no_grad(self.functions.get(expr.id)):
                return True  # `def nograd(f): ... with t.no_grad(): return f(...)` (simple-faster-rcnn)
            b = self.binding(expr)
            return b is not None and b.kind == "grad-mode" and b.call is not None and self._is_grad_off(b.call)
        if not isinstance(expr, ast.Call):
            return False
        q = self.resolve(expr.func)
        if _GRAD_OFF_NAME.search(last_name(expr.func) or "") and not (q or "").startswith("torch."):
            return True  # `@smart_inference_mode()`, `with utils.no_grad_if(cond):` (a project wrapper of torch's)
        if q in self.names["no_grad"]:
            mode = kwarg(expr, "mode", 0)
            return not is_constant(mode, False) if q.endswith("inference_mode") else True
        if q in self.names["set_grad_enabled"]:
            return not is_constant(kwarg(expr, "mode", 0), True)
        return False

    def _wraps_in_no_grad(self, fn: ast.AST | None) -> bool:
        """A decorator of this file whose wrapper calls the function under a `with` that disables autograd."""
        if fn is None:
            return False
        known: dict[ast.AST, bool] = self.__dict__.setdefault("_grad_wrappers", {})
        if fn not in known:
            known[fn] = False  # while it is read: a wrapper that names itself in its own `with` does not loop
            known[fn] = any(isinstance(sub, ast.With) and any(self._is_grad_off(i.context_expr) for i in sub.items)
                            for sub in subtree(fn))
        return known[fn]

    def grad_disabled(self, node: ast.AST, _depth: int = 0) -> bool:
        """Whether autograd is (or may be) off at `node`: no_grad/inference_mode blocks, decorators,
        `torch.set_grad_enabled(False)` before it, a framework hook that runs with grad off (callsites.py), or
        every caller in the file calls it with grad off."""
        # Asked of many nodes of one function (every call site, every model call): what a `with` block, a
        # function's decorators and a function's callers say is answered once per file, not once per node below.
        memo = self._grad_answers
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, WITHS) and child in anc.body:
                found = memo.get(anc)
                if found is None:
                    found = memo[anc] = any(
                        self._is_grad_off(item.context_expr) and not self._train_or_eval_toggle(item.context_expr, anc)
                        for item in anc.items)
                if found:
                    return True
            elif isinstance(anc, FUNCTIONS):
                found = memo.get(anc)
                if found is None:
                    # Lightning's validation_step and friends run with grad off too
                    found = memo[anc] = any(self._is_grad_off(d) for d in anc.decorator_list) \
                        or "no_grad" in self.framework_context(anc)
                if found:
                    return True
                if self._set_grad_false_before(anc, node):
                    return True
                key = (anc, _depth)
                found = memo.get(key)
                if found is None:
                    callers = self.callers(anc)
                    found = memo[key] = bool(callers) and _depth < 4 and all(
                        self.grad_disabled(c, _depth + 1) for c in callers)
                return found
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
        return any(isinstance(n, ast.Call) and n in backward for n in subtree(block))

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

"""Phases: values decided at run time that pick training or evaluation work in one piece of code.

A phase is a name whose value the code tests to decide what runs: the target of `for phase in ('train', 'val'):`,
or a parameter that the file's own calls set to different literals (`step('train', ...)` and `step('val', ...)`,
`run_epoch(..., is_train=True)` and `run_epoch(..., is_train=False)`). Each value is a pass the code really makes,
so both sides of `if phase == 'train':` are possible, and for each value this module answers what runs, whether
autograd records and which mode a `.train()`/`.eval()` switch leaves. A value it cannot decide stays unknown
(None), never taken for one side.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchdoctor.rules.static.semantic.loops import is_eval_word
from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import FUNCTIONS, WITHS, kwarg

if TYPE_CHECKING:
    from torchdoctor.rules.static.semantic.loops import Loop

# Parameter names that hold a boolean saying "this pass trains" (False: an evaluation pass).
_TRAIN_FLAGS = frozenset({"train", "training", "is_train", "is_training", "train_mode", "do_train", "backprop",
                          "update", "optimize"})


@dataclass(frozen=True)
class Phase:
    """A name tested in `scope`, and the values it takes there (strings or booleans)."""

    name: str
    values: tuple[Any, ...]
    scope: ast.AST  # the loop that binds it, or the function whose parameter it is
    evaluation: tuple[Any, ...]  # the values that make an evaluation pass
    origins: tuple[ast.Call, ...] = ()  # the calls that pass an evaluation value (a parameter's phase)

    def describe(self, value: Any) -> str:
        return f"`{self.name} = {value!r}`"


def _literal_strings(expr: ast.AST | None) -> tuple[str, ...] | None:
    if not isinstance(expr, ast.Tuple | ast.List) or len(expr.elts) < 2:
        return None
    words = tuple(e.value for e in expr.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return words if len(words) == len(expr.elts) else None


def _evaluation_strings(words: tuple[str, ...]) -> tuple[str, ...]:
    """The evaluation values of a phase, when the others train: `('train', 'val')` -> ('val',)."""
    evals = tuple(w for w in words if is_eval_word(w))
    return evals if evals and len(evals) < len(words) else ()


class Phases:
    """Which name decides between training and evaluation in a loop or a function, and what each value runs."""

    def loop_phase(self, loop: Loop) -> Phase | None:
        """The phase of the nearest enclosing loop of the same function that iterates literal phase names:
        `for phase in ['train', 'val']:` (or over a name bound once to such a list in the function, or a
        parameter whose default is one)."""
        fn = self.function_of(loop.node)
        outer: Loop | None = loop
        while outer is not None and self.function_of(outer.node) is fn:
            node = outer.node
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                words = _literal_strings(self._phase_list(node.iter, fn))
                if words is not None:
                    evals = _evaluation_strings(words)
                    if evals:
                        return Phase(node.target.id, words, node, evals)
            outer = outer.parent
        return None

    def _phase_list(self, expr: ast.AST, fn: ast.AST | None) -> ast.AST | None:
        if isinstance(expr, ast.Tuple | ast.List):
            return expr
        if not isinstance(expr, ast.Name) or fn is None:
            return None
        args = fn.args  # type: ignore[attr-defined]
        positional = args.posonlyargs + args.args
        defaults = dict(zip([a.arg for a in positional][len(positional) - len(args.defaults):], args.defaults,
                            strict=True))
        defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
        if expr.id not in defaults and not self.assigned_a(expr.id, (ast.Tuple, ast.List)):
            # `for batch in loader:` -- a name never given a list or tuple display anywhere and with no default
            # cannot hold phase names, and asking `defs` would build the file's table of assignments by scope
            return None
        values = [v for _, v in self.defs(fn).get(expr.id, [])]
        if len(values) == 1:
            return values[0]
        return defaults.get(expr.id) if not values else None

    def parameter_phase(self, fn: ast.AST) -> Phase | None:
        """A parameter of `fn` that the calls of this file set to literals making both a training and an
        evaluation pass: `step('train', ...)` / `step('val', ...)`, or a training flag passed False by one
        call and True by another (or left at a True default)."""
        if not isinstance(fn, FUNCTIONS):
            return None
        args = fn.args
        positional = [a.arg for a in args.posonlyargs + args.args]
        defaults: dict[str, ast.expr] = dict(zip(positional[len(positional) - len(args.defaults):], args.defaults,
                                                 strict=True))
        defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
        names = positional + [a.arg for a in args.kwonlyargs]
        callers = self.callers(fn)
        if len(callers) < 1:
            return None
        seen: dict[str, dict[Any, list[ast.Call]]] = {}
        for call in callers:
            offset = 1 if positional and positional[0] in ("self", "cls") and isinstance(call.func, ast.Attribute) else 0
            passed = {positional[i + offset]: a for i, a in enumerate(call.args) if i + offset < len(positional)}
            passed.update({k.arg: k.value for k in call.keywords if k.arg in names})
            for name in names:
                value = passed.get(name, defaults.get(name))
                if value is None and name in passed:
                    continue
                if isinstance(value, ast.Constant) and isinstance(value.value, str | bool):
                    seen.setdefault(name, {}).setdefault(value.value, []).append(call)
                else:
                    seen.setdefault(name, {})[None] = []  # a value this file does not decide
        for name, values in seen.items():
            if None in values or len(values) < 2:
                continue
            if all(isinstance(v, bool) for v in values):
                evaluation: tuple[Any, ...] = (True,) if is_eval_word(name) else (
                    (False,) if name.lower() in _TRAIN_FLAGS or "train" in name.lower() else ())
            elif all(isinstance(v, str) for v in values):
                evaluation = _evaluation_strings(tuple(values))
            else:
                evaluation = ()
            origins = tuple(c for v in evaluation for c in values.get(v, []))
            if evaluation and origins:
                return Phase(name, tuple(values), fn, evaluation, origins)
        return None

    def phase_value(self, test: ast.AST, phase: Phase, value: Any) -> bool | None:
        """The value of a condition when the phase holds `value`: True, False, or None when it does not depend
        on the phase alone (`phase == 'train' and step % 10 == 0` is False for 'val', unknown for 'train')."""
        if isinstance(test, ast.Name) and test.id == phase.name:
            return bool(value)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self.phase_value(test.operand, phase, value)
            return None if inner is None else not inner
        if isinstance(test, ast.BoolOp):
            parts = [self.phase_value(v, phase, value) for v in test.values]
            if isinstance(test.op, ast.And):
                return False if False in parts else (True if all(p is True for p in parts) else None)
            return True if True in parts else (False if all(p is False for p in parts) else None)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if isinstance(right, ast.Name) and right.id == phase.name and isinstance(op, ast.Eq | ast.NotEq):
                left, right = right, left
            if not (isinstance(left, ast.Name) and left.id == phase.name):
                return None
            if isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot) and isinstance(right, ast.Constant):
                same = value == right.value
                return same if isinstance(op, ast.Eq | ast.Is) else not same
            if isinstance(op, ast.In | ast.NotIn) and isinstance(right, ast.Tuple | ast.List | ast.Set):
                if not all(isinstance(e, ast.Constant) for e in right.elts):
                    return None
                inside = any(value == e.value for e in right.elts)  # type: ignore[attr-defined]
                return inside if isinstance(op, ast.In) else not inside
        return None

    def reads_phase(self, test: ast.AST, phase: Phase) -> bool:
        return any(isinstance(n, ast.Name) and n.id == phase.name for n in subtree(test))

    def runs_in_phase(self, node: ast.AST, phase: Phase, value: Any) -> bool:
        """Whether `node` may run in the pass where the phase holds `value`: no `if` between it and the phase's
        scope takes the other side for that value."""
        child = node
        for anc in self.ancestors(node):
            if anc is phase.scope:
                break
            if isinstance(anc, ast.If | ast.IfExp | ast.While) and child is not anc.test:
                decided = self.phase_value(anc.test, phase, value)
                orelse = anc.orelse if isinstance(anc.orelse, list) else [anc.orelse]
                in_else = child in orelse
                if decided is not None and decided is in_else:
                    return False
            child = anc
        return True

    def grad_off_in_phase(self, node: ast.AST, phase: Phase, value: Any) -> bool:
        """Whether autograd is off at `node` in the pass where the phase holds `value`, because of a switch keyed
        on the phase: `with torch.set_grad_enabled(phase == 'train'):`, `with torch.no_grad() if not is_train
        else nullcontext():`, or a statement `torch.set_grad_enabled(is_train)` earlier in the function."""
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, WITHS) and child in anc.body:
                if any(self._context_grad_off(item.context_expr, phase, value) for item in anc.items):
                    return True
            if anc is phase.scope or isinstance(anc, FUNCTIONS):
                break
            child = anc
        fn = self.function_of(node)
        line = getattr(node, "lineno", 0)
        for call in self.calls_to(*sorted(self.names["set_grad_enabled"])):
            if isinstance(self.parents.get(call), ast.Expr) and call.lineno < line and self.function_of(call) is fn:
                mode = kwarg(call, "mode", 0)
                if mode is not None and self.phase_value(mode, phase, value) is False \
                        and self.runs_in_phase(call, phase, value):
                    return True
        return False

    def _context_grad_off(self, expr: ast.AST, phase: Phase, value: Any) -> bool:
        if isinstance(expr, ast.IfExp):
            decided = self.phase_value(expr.test, phase, value)
            if decided is None:
                return False
            return self._context_grad_off(expr.body if decided else expr.orelse, phase, value)
        if isinstance(expr, ast.Name):
            fn = self.function_of(expr)
            values = [v for _, v in self.defs(fn).get(expr.id, [])] if fn is not None else []
            return len(values) == 1 and self._context_grad_off(values[0], phase, value)
        if not isinstance(expr, ast.Call):
            return False
        q = self.resolve(expr.func)
        if q in self.names["no_grad"]:
            return True
        if q in self.names["set_grad_enabled"]:
            mode = kwarg(expr, "mode", 0)
            return mode is not None and self.phase_value(mode, phase, value) is False
        return False

    def mode_in_phase(self, call: ast.Call, phase: Phase, value: Any) -> str | None:
        """What a mode switch leaves in the pass where the phase holds `value`: 'train', 'eval', or None when it
        does not run in that pass or its argument is not decided by the phase."""
        func = call.func
        if not isinstance(func, ast.Attribute) or func.attr not in ("train", "eval"):
            return None
        if not self.runs_in_phase(call, phase, value):
            return None
        if func.attr == "eval":
            return "eval" if not call.args and not call.keywords else None
        mode = kwarg(call, "mode", 0)
        if mode is None:
            return "train"
        if isinstance(mode, ast.Constant):
            return "train" if mode.value else "eval"
        decided = self.phase_value(mode, phase, value)
        return None if decided is None else ("train" if decided else "eval")

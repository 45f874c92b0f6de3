"""Loops and their roles: the batch (step) loop, the epoch loop, training and validation loops."""

from __future__ import annotations

import ast
import re
import weakref
from collections.abc import Iterator
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.bindings import Binding, looks_like_loader
from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import (
    LOOPS,
    SCOPES,
    _position,
    dotted,
    element_container,
    keyed_name,
    stmt_position,
)

if TYPE_CHECKING:
    from torchdoctor.rules.static.semantic.bindings import Binding
    from torchdoctor.rules.static.semantic.loops import Loop


@dataclass
class Loop:
    node: ast.For | ast.AsyncFor | ast.While
    scope: ast.AST
    # The enclosing loop, held weakly (the index's `loops` keeps every loop alive): with a strong reference each way
    # between a loop and its `children`, the loops and the AST they hold were freed only by the garbage collector,
    # which then carried every nested loop's subtree through its passes.
    outer: InitVar[Loop | None]
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
    # One optimizer step per epoch (full-batch training: `for epoch in range(n): loss = model(graph).backward();
    # optimizer.step()`, no batch loop inside): the loop is the batch loop and the epoch loop at once.
    full_batch: bool = False

    def __post_init__(self, outer: Loop | None) -> None:
        self._outer = weakref.ref(outer) if outer is not None else None

    @property
    def parent(self) -> Loop | None:
        return self._outer() if self._outer is not None else None

    def all_calls(self) -> Iterator[ast.Call]:
        yield from self.calls
        for child in self.children:
            yield from child.all_calls()

    @property
    def line(self) -> int:
        return self.node.lineno

_EVAL_WORD = re.compile(
    r"(?:^|[^a-z])(?:val|valid|validation|validate|test|testing|eval|evaluate|evaluation|dev|holdout|predict|"
    r"prediction|inference|infer)(?:[^a-z]|loader|dl|set|data|ds|$)"
)

# Methods of a model that run its forward pass (Hugging Face and minGPT `generate`, decorated with no_grad).
_RUN_METHODS = frozenset({"generate"})
# Calls in a loop condition whose value depends only on their arguments (`isinstance(x, T)`, `len(xs)`).
_PURE_BUILTINS = frozenset({"isinstance", "hasattr", "getattr", "len", "callable", "type", "bool", "int", "str"})
# Methods that change the container they are called on: a loop that calls them rebinds that name's contents.
_MUTATORS = frozenset({"append", "add", "update", "pop", "clear", "extend", "insert", "remove", "setdefault"})


def is_eval_word(name: str | None) -> bool:
    return bool(name) and bool(_EVAL_WORD.search(name.lower()))

def _depth(loop: Loop) -> int:
    d = 0
    while loop.parent is not None:
        loop = loop.parent
        d += 1
    return d

class Loops:
    """Which calls train (backward, optimizer steps) and which loops run them, and in what role."""

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
        # autograd's backward returns None: a `.backward(...)` whose result is used (`z, ld = flow.backward(z)`,
        # a normalizing flow's inverse pass) is a method of the project's own, not a training step.
        backward = [c for c in self.method_calls("backward") + self.method_calls("manual_backward")
                    if isinstance(self.parent(c), ast.Expr)]
        backward += self.calls_to("torch.autograd.backward")
        self.backward_calls = sorted(backward, key=stmt_position)
        self.step_calls = [c for c in self.method_calls("step") if self.is_optimizer_step(c)]
        for call in self.backward_calls + self.step_calls + self.training_step_calls():
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

    def training_step_calls(self) -> list[ast.Call]:
        """`model.optimize_parameters(step)`, `trainer.train_step(batch)`: a whole step run by an object of
        another module (not a method of this file, which the file's own backward and step calls answer for)."""
        out = []
        for method in self.names["training_step_methods"]:
            out += [c for c in self.method_calls(method) if self.local_target(c) is None]
        return out

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
            if isinstance(iterable, ast.NamedExpr):  # `enumerate(pbar := tqdm(loader))`
                iterable = iterable.value
            elif isinstance(iterable, ast.Call) and self.callee(iterable) == "zip" and iterable.args:
                # `zip(range(eval_iters), loader)` (nanoGPT-style estimate_loss): the data is the first operand that
                # is not a counter
                counted = [a for a in iterable.args if not (isinstance(a, ast.Call) and self.callee(a) in (
                    "range", "itertools.count", "count"))]
                iterable = counted[0] if counted else iterable.args[0]
            elif isinstance(iterable, ast.Call) and iterable.args and self.callee(iterable) in wrappers:
                iterable = iterable.args[0]
            else:
                break
        return iterable

    # -- what changes from one iteration to the next ---------------------------------------------

    def assigned_in(self, loop: Loop) -> frozenset[str]:
        """Names and attribute chains the loop (re)binds: its targets, assignments, `+=`, `with ... as`."""
        cached = self._assigned.get(loop.node)
        if cached is not None:
            return cached
        out: set[str] = set()
        for sub in subtree(loop.node):
            if isinstance(sub, ast.Name | ast.Attribute | ast.Subscript) and isinstance(sub.ctx, ast.Store | ast.Del):
                name = dotted(sub.value if isinstance(sub, ast.Subscript) else sub)
                if name is not None:
                    out.add(name)
            elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _MUTATORS:
                name = dotted(sub.func.value)  # `seen.add(x)`, `hist.append(v)`: the container changes
                if name is not None:
                    out.add(name)
        result = frozenset(out)
        self._assigned[loop.node] = result
        return result

    def varies_in(self, expr: ast.AST, loop: Loop) -> bool:
        """Whether `expr` can take another value on another iteration of `loop`: it reads something the loop
        rebinds (a counter, the batch, a flag set in the body) or calls something (`random.random()`). A test on
        `args.amp` or `self.use_ema` alone is fixed for the whole loop: what it guards runs every iteration."""
        assigned = self.assigned_in(loop)
        for sub in subtree(expr):
            if isinstance(sub, ast.Call):
                if not (isinstance(sub.func, ast.Name) and sub.func.id in _PURE_BUILTINS):
                    return True
            elif isinstance(sub, ast.Name | ast.Attribute):
                name = dotted(sub)
                while name:
                    if name in assigned:
                        return True
                    name = name.rpartition(".")[0]
        return False

    def guarded_in_function(self, node: ast.AST) -> bool:
        """Whether `node` sits under an `if`/`try` handler in its function (outside any loop): it may not run on
        every call of the function."""
        for anc in self.ancestors(node):
            if isinstance(anc, SCOPES) or isinstance(anc, LOOPS):
                return False
            if isinstance(anc, ast.If | ast.IfExp | ast.ExceptHandler):
                return True
        return False

    def rare_in(self, test: ast.AST, loop: Loop, _depth: int = 0) -> bool:
        """Whether a condition holds on few iterations of `loop` only: a period (`step % k == 0`), one iteration
        (`epoch == start`, `i == 0`), a sample (`random.random() < p`), or a flag set from one of those in the
        loop. `epoch < 10`, `not args.notest` or `step > warmup` hold on most iterations."""
        if _depth > 3:
            return False
        if isinstance(test, ast.BoolOp):
            parts = [self.rare_in(v, loop, _depth + 1) for v in test.values]
            return any(parts) if isinstance(test.op, ast.And) else all(parts)
        if isinstance(test, ast.Compare):
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in subtree(test)):
                return not any(isinstance(op, ast.NotEq | ast.IsNot) for op in test.ops)
            if any(isinstance(n, ast.Call) and (self.callee(n) or "").startswith(("random.", "numpy.random.", "np.random."))
                   for n in subtree(test)):
                return True
            return all(isinstance(op, ast.Eq | ast.Is) for op in test.ops) and self.varies_in(test, loop)
        if isinstance(test, ast.BinOp) and isinstance(test.op, ast.Mod):
            return False  # `if step % k:` holds on all but one iteration in k
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.BinOp) \
                and isinstance(test.operand.op, ast.Mod):
            return True  # `if not step % k:`
        if isinstance(test, ast.Name) and test.id in self.assigned_in(loop):
            values = [v for s, v in self.defs(self.scope_of(test)).get(test.id, [])
                      if loop.node.lineno <= s.lineno <= (loop.node.end_lineno or s.lineno)]
            return bool(values) and all(self.rare_in(v, loop, _depth + 1) for v in values)
        return False

    def guarded_in_loop(self, node: ast.AST, loop: Loop, rare: bool = False) -> bool:
        """Whether something between `node` and `loop` may skip it on some iterations: an `if` (or `x if c
        else y`, `while`, `assert`) whose test varies from one iteration to the next, or an `except` handler.
        A `try` body runs every time; an `if` on a fixed setting runs every time or never. With `rare`, only a
        test that holds on few iterations (see `rare_in`) counts: `if epoch > 10:` still runs on most epochs."""
        child = node
        for anc in self.ancestors(node):
            if anc is loop.node:
                return False
            if isinstance(anc, ast.If | ast.IfExp | ast.While | ast.Assert):
                if child is anc.test:
                    return True  # in the test itself, the iteration decides on the value: not skippable work
                orelse = getattr(anc, "orelse", [])  # an `assert`'s message has no else branch
                in_else = child in orelse if isinstance(orelse, list) else child is orelse
                if rare:
                    if not in_else and self.rare_in(anc.test, loop):
                        return True
                elif self.varies_in(anc.test, loop) or _period_test(anc.test):
                    return True
            elif isinstance(anc, ast.ExceptHandler):
                return True
            elif isinstance(anc, ast.Try) and child in anc.orelse:
                return True
            child = anc
        return False

    def _build_loops(self) -> None:
        nodes = sorted(self.nodes(ast.For) + self.nodes(ast.AsyncFor) + self.nodes(ast.While), key=stmt_position)
        if not nodes:
            return
        for node in nodes:  # outer loops come first in source order
            parent = self.loop_of(node)
            targets: tuple[str, ...] = ()
            source = None
            binding = None
            iterates_loader = False
            if isinstance(node, ast.For | ast.AsyncFor):
                target = node.target
                targets = (target.id,) if isinstance(target, ast.Name) else tuple(
                    n.id for n in subtree(target) if isinstance(n, ast.Name))
                src = self._iter_source(node.iter)
                source = dotted(src) or keyed_name(src)
                binding = self.binding(src)
                iterates_loader = (binding is not None and binding.kind == "dataloader") or (
                    binding is None and looks_like_loader(dotted(element_container(src)))
                )
            loop = Loop(node, self.scope_of(node), parent, targets, source, binding, iterates_loader)
            self.loops[node] = loop
            if parent is not None:
                parent.children.append(loop)
        # A call on a line no loop spans sits in no loop: only the others are asked which loop holds them (a node's
        # lines lie within its ancestors'), so a file's calls outside its loops cost no climb of their ancestors.
        spanned = bytearray(max(n.end_lineno or n.lineno for n in nodes) + 2)
        for node in nodes:
            end = node.end_lineno or node.lineno
            spanned[node.lineno:end + 1] = b"\x01" * (end + 1 - node.lineno)
        last = len(spanned)
        for call in self.nodes(ast.Call):
            if call.lineno < last and spanned[call.lineno]:  # type: ignore[attr-defined]
                loop = self.loop_of(call)
                if loop is not None:
                    loop.calls.append(call)
        backward = set(self.backward_calls)
        steps = set(self.step_calls)
        local_targets = dict(self._local_function_calls())
        external_steps = set(self.training_step_calls())
        # a call hands over an optimizer built here only when some name's latest binding is one
        optimizers = any(bs and bs[-1].kind == "optimizer" for bs in self.bindings.values())
        for loop in self.loops.values():
            loop.calls.sort(key=stmt_position)
            for call in loop.calls:
                if call in backward:
                    loop.has_backward = True
                elif call in steps:
                    loop.has_step = True
                target = local_targets.get(call)
                if target is not None and target in self.training_functions or call in external_steps:
                    loop.calls_training = True
                elif target is None and optimizers and self._hands_model_and_optimizer(call):
                    loop.calls_training = True  # `train_one_epoch(model, criterion, loader, optimizer, ...)` of engine.py
        for loop in sorted(self.loops.values(), key=lambda lp: -_depth(lp)):
            loop.trains = loop.has_backward or loop.has_step or loop.calls_training or any(
                c.trains for c in loop.children
            )
        for loop in self.loops.values():
            if loop.has_backward or loop.has_step or loop.iterates_loader:
                loop.kind = "batch"
                loop.full_batch = not loop.iterates_loader and not any(c.trains for c in loop.children) \
                    and _counts_epochs(loop.node)
            elif loop.trains or any("epoch" in t.lower() for t in loop.targets):
                loop.kind = "epoch"
        for loop in self.loops.values():
            loop.validation = self._is_validation(loop)

    def _hands_model_and_optimizer(self, call: ast.Call) -> bool:
        """A call of a function of another module handed a model and an optimizer built in this file: it trains
        that model, here in this loop's iteration."""
        if not isinstance(call.func, ast.Name | ast.Attribute) or not (call.args or call.keywords):
            return False
        values = [*call.args, *(k.value for k in call.keywords)]
        optimizer = model = False
        for v in values:
            if not isinstance(v, ast.Name | ast.Attribute):
                continue
            b = self.binding(v)
            optimizer = optimizer or (b is not None and b.kind == "optimizer")  # built as one in this file
            model = model or self.is_model(v)
        return optimizer and model

    def _is_validation(self, loop: Loop) -> bool:
        """A loop that runs the model without training it, over data named or used as evaluation data."""
        if loop.trains:
            return False
        # The cheap questions first; whether the loop runs a model (through local functions too) last.
        if not self._evaluation_shaped(loop):
            return False
        return any(self.call_runs_model(c) for c in loop.all_calls())

    def _evaluation_shaped(self, loop: Loop) -> bool:
        fn = self.function_of(loop.node)
        if loop.source is None or not loop.iterates_loader:
            if loop.source is not None and is_eval_word(loop.source):
                return True
            # `for x, y in batches:` over a list of (input, label) pairs, with autograd off, measuring a loss or
            # counting correct predictions, in a function that never asks for training mode: an evaluation over
            # held-out batches, whatever the list is called
            if loop.source is not None and len(loop.targets) >= 2 and self._measures_without_grad(loop, fn):
                return True
            # `for i in range(len(dataset)): x = dataset[i]` or `for i in range(n): batch = next(val_iter)` after
            # `model.eval()`, with nothing trained in it: the mode says evaluation, whatever the loop counts. A loop
            # that reads no data (sampling a generator, profiling models one by one) is not an evaluation.
            if self.eval_mode_before(loop) is None:
                return False
            return (fn is not None and is_eval_word(fn.name)) or self._reads_data(loop)
        if is_eval_word(loop.source):  # val_loader, test_set, eval_dl
            return True
        if fn is not None and is_eval_word(fn.name):  # def evaluate(model, loader)
            return True
        if self.eval_mode_before(loop) is not None:
            return True
        # A loop over a loader in code that runs with autograd off, switches no mode and measures a loss
        # (`@torch.inference_mode() def estimate_loss(model, loaders, ...)` in ethos-ares: `model(X, labels=Y).loss`):
        # what it measures is not trained on. A `.train()` in the function (batch-norm recalibration under no_grad)
        # says the training mode is meant; a loop that only collects outputs (swav's memory bank of training
        # embeddings) measures nothing.
        return self._measures_without_grad(loop, fn)

    def _measures_without_grad(self, loop: Loop, fn: ast.AST | None) -> bool:
        """Autograd is off, the loop measures (a loss, or correct predictions counted the way an accuracy is:
        `(model(x).argmax(-1) == y).sum()`), and its function never asks for training mode."""
        return self.grad_disabled(loop.node) and (self._measures_loss(loop) or _compares_predictions(loop.node)) \
            and not any(self.function_of(c) is fn for c in self.method_calls("train"))

    def _measures_loss(self, loop: Loop) -> bool:
        """The loop computes a loss: a loss function's call (`criterion(out, y)`, `F.cross_entropy(...)`), or the
        `loss` a model returns when handed the labels (`model(x, labels=y).loss`)."""
        for call in loop.all_calls():
            b = self.binding(call.func)
            if b is not None and b.kind == "loss" or any(k.arg == "labels" for k in call.keywords):
                return True
            q = self.callee(call) or ""
            if q.startswith("torch.nn.functional.") and ("loss" in q or q.endswith(("cross_entropy", "nll_loss"))):
                return True
        return any(isinstance(n, ast.Attribute) and n.attr == "loss" and isinstance(n.ctx, ast.Load)
                   for n in subtree(loop.node))

    def _reads_data(self, loop: Loop) -> bool:
        """The loop takes an item per iteration: `dataset[i]` with its own counter, or `next(data_iter)`."""
        targets = set(loop.targets)
        for sub in subtree(loop.node):
            if isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Load) and any(
                isinstance(n, ast.Name) and n.id in targets for n in subtree(sub.slice)
            ):
                return True
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "next":
                return True
        return False

    def call_runs_model(self, call: ast.Call, _depth: int = 0) -> bool:
        """A call of a model (`model(x)`, `self.nets["G"](z)`), or of a function or method of this file that
        runs one (`self._eval_step(batch)`, `evaluate(net, batch)`)."""
        func = call.func
        if isinstance(func, ast.Name | ast.Attribute | ast.Subscript) and self.is_model(func):
            return True
        if _depth == 0 and self.model_run_method(call) is not None:
            return True  # in the loop itself: a helper that generates is often decorated with no_grad
        if isinstance(func, ast.Attribute) and func.attr == "forward" and self.is_model(func.value) and (
            _depth == 1 or self._evaluation_forward(call)
        ):
            # `self._model.forward(task, batch)` inside the loop's own helper (jiant's `self._forward(batch)`): a
            # pass-through to the model. In the loop itself `model.forward(x)` stays out: gradient loops call it
            # directly (FROMP's Fisher loops, notes_bugs_h.md), unless the call says it is not training
            # (DB's `model.forward(batch, training=False)`).
            return True
        if _depth >= 2:
            return False
        target = self.local_target(call)
        return target is not None and any(self.call_runs_model(c, _depth + 1) for c in self.calls_in(target))

    def _evaluation_forward(self, call: ast.Call) -> bool:
        """A forward told it is not training: a keyword of vocabulary.toml `evaluation_forward_flags` set to False."""
        flags = self.names["evaluation_forward_flags"]
        return any(k.arg in flags and isinstance(k.value, ast.Constant) and k.value.value is False
                   for k in call.keywords)

    def model_run_method(self, call: ast.Call) -> ast.expr | None:
        """The model a method call runs through its forward: `model.generate(x)` (Hugging Face decoding; TrOCR's
        `predict`); None for anything else."""
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in _RUN_METHODS and self.is_model(func.value):
            return func.value
        return None

    def local_target(self, call: ast.Call) -> ast.AST | None:
        """The function or method of this file a call runs (`helper(x)`, `self._eval_step(batch)`), if any."""
        if self._local_target_map is None:
            self._local_target_map = dict(self._local_function_calls())
        return self._local_target_map.get(call)

    def calls_in(self, fn: ast.AST) -> list[ast.Call]:
        """The calls made in a function's own body (not in functions nested in it), in source order."""
        if self._calls_by_fn is None:
            table: dict[ast.AST | None, list[ast.Call]] = {}
            for c in self.nodes(ast.Call):
                table.setdefault(self.function_of(c), []).append(c)
            for calls in table.values():
                calls.sort(key=_position)
            self._calls_by_fn = table
        return self._calls_by_fn.get(fn, [])

    def eval_mode_before(self, loop: Loop) -> ast.Call | None:
        """The `model.eval()` earlier in the loop's scope that is still in force (no `model.train()` since)."""
        mode_calls = [
            c
            for c in self.method_calls("eval") + self.method_calls("train")
            if self.scope_of(c) is loop.scope
            and c.lineno < loop.node.lineno
            and self.is_model(c.func.value)  # type: ignore[attr-defined]
        ]
        if mode_calls:
            last = max(mode_calls, key=_position)
            if last.func.attr == "eval" and not last.args and not last.keywords:  # type: ignore[attr-defined]
                return last
        return None

    def training_loops(self) -> list[Loop]:
        return [lp for lp in self.loops.values() if lp.trains]

    def validation_loops(self) -> list[Loop]:
        return [lp for lp in self.loops.values() if lp.validation]

    def epoch_loops(self) -> list[Loop]:
        return [lp for lp in self.loops.values() if lp.kind == "epoch"]


_PREDICTION_METHODS = frozenset({"argmax", "max", "topk"})


def _is_prediction(expr: ast.AST) -> bool:
    """`out.argmax(1)`, `torch.max(out, 1)[1]`, `logits.topk(5)`: the class a model's scores pick."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute | ast.Name)
               and (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id) in _PREDICTION_METHODS
               for n in subtree(expr))


def _compares_predictions(node: ast.AST) -> bool:
    """The loop checks predictions against labels: `pred == y`, `pred.eq(y)` on an argmax/max/topk, the way an
    accuracy is counted (only an evaluation does that over a whole loader with autograd off)."""
    for sub in subtree(node):
        if isinstance(sub, ast.Compare) and any(isinstance(op, ast.Eq) for op in sub.ops) \
                and any(_is_prediction(side) for side in [sub.left, *sub.comparators]):
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "eq" \
                and (_is_prediction(sub.func.value) or any(_is_prediction(a) for a in sub.args)):
            return True
    return False


def _counts_epochs(node: ast.AST) -> bool:
    """The loop counts epochs by its own words: its variable (`for epoch in ...`) or the bound of its `range()`
    (`range(args.max_epoch)`, `trange(n_epochs)`)."""
    if not isinstance(node, ast.For | ast.AsyncFor):
        return False
    words = [n.id for n in subtree(node.target) if isinstance(n, ast.Name)]
    if isinstance(node.iter, ast.Call):
        for arg in node.iter.args:
            words += [dotted(n) or "" for n in subtree(arg) if isinstance(n, ast.Name | ast.Attribute)]
    return any("epoch" in w.lower() for w in words)


def _period_test(test: ast.AST) -> bool:
    """`saver.global_step % interval == 0`: a period test skips iterations even when the counter it reads is
    advanced out of sight (`saver.global_step_increment()` in DDSP-SVC's solver), not rebound in the loop."""
    return isinstance(test, ast.Compare) and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                                                 for n in subtree(test))

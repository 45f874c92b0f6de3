"""TD4xx — mixed precision and optimization: the AMP API and the order of its calls (autocast,
GradScaler, unscale_, clipping), learning-rate schedulers, gradient accumulation, zero_grad and
weight decay. Docs: mixed_precision.toml.

The gradient-accumulation helper (`accumulations`) is shared with the distributed family (TD305).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torchdoctor.rules.static.api import Context, project, rule
from torchdoctor.rules.static.index import (
    FUNCTIONS,
    AutocastRegion,
    Index,
    Loop,
    dotted,
    is_constant,
    kwarg,
    last_name,
)
from torchdoctor.rules.static.project import Project, ProjectHit
from torchdoctor.rules.static.semantic import crossings
from torchdoctor.rules.static.semantic.options import option_defaults
from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import ACCUMULATION_NAME

# -- small expression helpers ----------------------------------------------------------------------


def _position(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _between(index: Index, node: ast.AST, stop: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(ancestor, child) pairs from `node` up to, not including, `stop`."""
    child = node
    for anc in index.ancestors(node):
        if anc is stop:
            return
        yield anc, child
        child = anc


def _value_of(index: Index, name: str, at: ast.AST) -> ast.expr | None:
    """The latest value assigned to `name` before `at` in its scope, else its only module-level value."""
    values = index.definitions(name, at)
    if values:
        return values[-1]
    module = index.defs(index.tree).get(name, [])
    return module[0][1] if len(module) == 1 else None


def _augmented(ctx: Context, name: str) -> bool:
    """`name += ...` / `name //= ...` somewhere: its assigned value is not the whole story."""
    key = ("augmented", name)
    return ctx.memo(key, lambda: bool(re.search(rf"(?<![\w.]){re.escape(name)}\s*(?:[-+*/%@&|^]|//|\*\*)=", ctx.source)))


def number(ctx: Context, expr: ast.AST | None, at: ast.AST, depth: int = 0) -> float | None:
    """The value of a small arithmetic expression of constants and once-assigned names, else None."""
    if expr is None or depth > 4:
        return None
    if isinstance(expr, ast.Constant):
        v = expr.value
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        v = number(ctx, expr.operand, at, depth + 1)
        return -v if v is not None else None
    if isinstance(expr, ast.BinOp):
        left, right = number(ctx, expr.left, at, depth + 1), number(ctx, expr.right, at, depth + 1)
        if left is None or right is None:
            return None
        op = expr.op
        try:
            if isinstance(op, ast.Add):
                return left + right
            if isinstance(op, ast.Sub):
                return left - right
            if isinstance(op, ast.Mult):
                return left * right
            if isinstance(op, ast.Div):
                return left / right
            if isinstance(op, ast.FloorDiv):
                return float(left // right)
            if isinstance(op, ast.Pow) and abs(right) <= 64:
                return float(left**right)
        except (ZeroDivisionError, OverflowError):
            return None
        return None
    if isinstance(expr, ast.Name) and not _augmented(ctx, expr.id):
        value = _value_of(ctx.index, expr.id, at)
        if value is None:
            return _handed_number(ctx, expr.id, at, depth)
        return number(ctx, value, at, depth + 1)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self" \
            and not _augmented(ctx, f"self.{expr.attr}"):
        value = _attribute_value(ctx.index, expr, at)
        if value is not None:
            return number(ctx, value, value, depth + 1)
    default = _option_default(ctx, expr)
    if default is not None:
        return number(ctx, default, at, depth + 1)
    return None


def _attribute_value(index: Index, expr: ast.Attribute, at: ast.AST) -> ast.expr | None:
    """The one value the methods of the class around `at` assign to `self.<attr>` (`self.epochs = epochs` in
    `__init__`, read by `for epoch in range(self.epochs)` in `fit`), else None."""
    info = index.class_of(at)
    if info is None:
        return None
    name = f"self.{expr.attr}"
    values = [v for fn in info.node.body if isinstance(fn, FUNCTIONS) for _, v in index.defs(fn).get(name, [])]
    return values[0] if len(values) == 1 else None


def _handed_number(ctx: Context, name: str, at: ast.AST, depth: int) -> float | None:
    """A parameter's value when every call of its function in this file hands in the same number
    (`fit(net, dl, opt, crit, sched, 90)` into `def fit(m, dl, o, crit, s, epochs)`): a count the loop's `range()`
    or a schedule's size reads is often set by the caller, not where it is read."""
    index = ctx.index
    fn = index.function_of(at)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if name not in params and name not in [a.arg for a in fn.args.kwonlyargs]:
        return None
    default = _parameter_default(fn, name)
    found: set[float | None] = set()
    callers = index.callers(fn)
    for call in callers:
        bound = isinstance(call.func, ast.Attribute) or fn.name == "__init__"  # `self.m(...)`, `Trainer(...)`
        offset = 1 if params and params[0] in ("self", "cls") and bound else 0
        position = params.index(name) - offset if name in params else None
        arg = kwarg(call, name, position if position is not None and position >= 0 else None)
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return None  # an argument we cannot line up
        if arg is None and default is None:
            return None
        found.add(number(ctx, arg, call, depth + 1) if arg is not None else number(ctx, default, fn, depth + 1))
    if not callers and default is not None:  # called from another file, or not at all: the declared default
        return number(ctx, default, fn, depth + 1)
    return found.pop() if len(found) == 1 else None


def _parameter_default(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> ast.expr | None:
    args = fn.args.posonlyargs + fn.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(fn.args.defaults):]], fn.args.defaults, strict=True))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d is not None})
    return defaults.get(name)


def _option_default(ctx: Context, expr: ast.AST) -> ast.expr | None:
    """`args.step_size` where the file declares `--step_size` with a default: that default. Also `self.args.epochs`
    (the namespace a trainer keeps), and an option another file of the project declares (`main.py` parses the
    command line and hands `args` to the trainer of `trainer.py`)."""
    if not isinstance(expr, ast.Attribute):
        return None
    holder = expr.value
    if isinstance(holder, ast.Attribute):
        if not (isinstance(holder.value, ast.Name) and holder.value.id == "self"):
            return None
    elif not (isinstance(holder, ast.Name) and holder.id != "self"):
        return None
    defaults = ctx.memo("option_defaults", lambda: option_defaults(ctx.index.tree))
    found = defaults.get(expr.attr)
    project = ctx.index.project
    if found is None and project is not None and project.options is not None:
        found = project.options.default(expr.attr)
    return found


def _count_text(n: float) -> str:
    return f"{n:,.0f}" if n == int(n) else f"{n:g}"


_STEP_WORD = re.compile(r"step|iter|batch|update", re.I)
# StepLR's own parameter name, as an option or variable (`args.step_size`, `lr_step_size`, `args.lr_step`): it names
# the argument, not the unit it counts, so it says neither batches nor epochs.
_UNITLESS_WORD = re.compile(r"^(?:lr_)?step_size$|^lr_steps?$", re.I)
_EPOCH_WORD = re.compile(r"epoch", re.I)


def units(index: Index, expr: ast.AST | None, at: ast.AST, depth: int = 0) -> set[str]:
    """What a length expression counts, read from its names: "len" (a len() call), "batch" (names about
    steps, iterations, batches or updates: `total_steps`, `steps_per_epoch`, `max_iters`) or "epoch"."""
    found: set[str] = set()
    if expr is None or depth > 2:
        return found
    for node in subtree(expr):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
            found.add("len")
        elif isinstance(node, ast.Name | ast.Attribute) and not isinstance(getattr(node, "ctx", None), ast.Store):
            word = node.id if isinstance(node, ast.Name) else node.attr
            if isinstance(node, ast.Attribute) and word == "step" and isinstance(node.value, ast.Call):
                continue  # `LambdaLR(n_epochs, offset, decay_epoch).step`: a method passed as the lambda, not a count
            if _UNITLESS_WORD.match(word):
                pass
            elif _STEP_WORD.search(word):
                found.add("batch")
            elif _EPOCH_WORD.search(word):
                found.add("epoch")
            if isinstance(node, ast.Name):
                value = _value_of(index, node.id, at)
                if value is not None and value is not expr:
                    found |= units(index, value, value, depth + 1)
        elif isinstance(node, ast.arg):
            if _STEP_WORD.search(node.arg):
                found.add("batch")
            elif _EPOCH_WORD.search(node.arg):
                found.add("epoch")
    return found


def _plan(found: set[str]) -> str | None:
    if "len" in found or "batch" in found:
        return "batch"
    if found == {"epoch"}:
        return "epoch"
    return None


# -- gradient accumulation (shared with TD305) ---------------------------------------------------


@dataclass(frozen=True)
class Accumulation:
    """A loop whose iterations are micro-steps: several backward() calls per optimizer step."""

    loop: Loop  # the loop that runs the micro-steps
    count: ast.expr  # micro-steps per optimizer step (`accum_steps`, `args.gradient_accumulation_steps`, 4)
    backward: tuple[ast.Call, ...]  # the micro-step backward calls
    steps: tuple[ast.Call, ...]  # the optimizer steps they feed
    style: str  # "modulo": step under `if (i + 1) % n == 0`; "inner-loop": `for _ in range(n): backward()`


_ACCUM_NAME = ACCUMULATION_NAME


def _find_mod(index: Index, expr: ast.AST, at: ast.AST, depth: int = 0) -> ast.expr | None:
    """The modulus in a test like `(i + 1) % accum == 0`, also through a name assigned one
    (`last_micro = (i + 1) % accum == 0; if last_micro:`)."""
    for node in subtree(expr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                continue  # "%d" % x: string formatting
            return node.right
    if depth >= 2:
        return None
    for node in subtree(expr):
        if isinstance(node, ast.Name):
            value = _value_of(index, node.id, at)
            if value is not None:
                found = _find_mod(index, value, value, depth + 1)
                if found is not None:
                    return found
    return None


def _mod_guard(index: Index, node: ast.AST, loop: Loop) -> ast.expr | None:
    """The accumulation modulus when `node` runs only on some iterations of `loop`: under an
    `if ... % n ...` or after an `if not <...% n...>: continue` earlier in the loop body."""
    for anc, child in _between(index, node, loop.node):
        if isinstance(anc, ast.If):
            mod = _find_mod(index, anc.test, anc)
            if mod is not None:
                return mod
        if isinstance(child, ast.stmt) and anc is not None:
            body = getattr(anc, "body", None)
            if isinstance(body, list) and child in body:
                for s in body:
                    if s is child:
                        break
                    if isinstance(s, ast.If) and s.body and isinstance(s.body[-1], ast.Continue):
                        mod = _find_mod(index, s.test, s)
                        if mod is not None:
                            return mod
    # a statement directly in the loop body
    for s in loop.node.body:
        if _position(s) >= _position(node):
            break
        if isinstance(s, ast.If) and s.body and isinstance(s.body[-1], ast.Continue):
            mod = _find_mod(index, s.test, s)
            if mod is not None:
                return mod
    return None


def _backward_helpers(index: Index) -> set[ast.AST]:
    """This file's functions that run a backward and step no optimizer: a call of one is a micro-step's backward
    (NJUNMT's `compute_forward(...)` doing `torch.autograd.backward(loss)` and returning `loss.item()`)."""
    stepping = {index.function_of(c) for c in index.step_calls}
    return {fn for c in index.backward_calls if not is_engine_backward(c)
            for fn in [index.function_of(c)] if fn is not None and fn not in stepping}


def _pieces_of_the_batch(index: Index, loop: Loop) -> ast.expr | None:
    """The iterable of an inner loop that walks pieces of the batch its parent loop is on (NJUNMT's
    `for seqs_x_t, seqs_y_t in split_shard(seqs_x, seqs_y, split_size=update_cycle)`, with `seqs_x, seqs_y =
    batch` from `for batch in training_iter`; `for chunk in batch.chunk(k)`): its iterations are micro-batches of
    one batch, not tasks or models."""
    parent = loop.parent
    source = getattr(loop.node, "iter", None)
    if parent is None or not isinstance(source, ast.Call):
        return None
    batch = set(parent.targets)
    scope = index.defs(index.scope_of(loop.node))
    start, end = parent.node.lineno, loop.node.lineno
    for name, bindings in scope.items():  # names unpacked from the batch inside the parent loop, before this one
        for stmt, value in bindings:
            if start < stmt.lineno < end and any(isinstance(n, ast.Name) and n.id in batch for n in subtree(value)):
                batch.add(name)
    read = {n.id for n in subtree(source) if isinstance(n, ast.Name)}
    return source if read & batch else None


def _range_count(call: ast.AST) -> ast.expr | None:
    """n for `range(n)`."""
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range":
        if len(call.args) == 1 and not call.keywords:
            return call.args[0]
    return None


def is_engine_backward(call: ast.Call) -> bool:
    """`accelerator.backward(loss)`, `engine.backward(loss)`, `self.manual_backward(loss)`: a framework
    that scales, normalises and syncs on its own."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "manual_backward":
        return True
    return bool(call.args) and last_name(func.value) not in ("autograd",)


def accumulations(ctx: Context, framework_backward: bool = False) -> list[Accumulation]:
    """Every gradient-accumulation loop of the file (memoised). With `framework_backward`, also the loops whose
    backward is a training framework's (`fabric.backward`, `accelerator.backward`): for the questions such a
    backward does not answer on its own (whether DDP all-reduces on every micro-step)."""
    return ctx.memo(("accumulations", framework_backward), lambda: _accumulations(ctx.index, framework_backward))


def _accumulations(index: Index, framework_backward: bool = False) -> list[Accumulation]:
    found: list[Accumulation] = []
    backward = set(index.backward_calls)
    steps = set(index.step_calls)
    helpers = _backward_helpers(index)
    updaters = _update_helpers(index)
    for loop in index.loops.values():
        backs = [c for c in loop.calls
                 if c in backward and (not is_engine_backward(c)
                                       or (framework_backward and index.framework_call(c, "backward")))
                 or index.local_target(c) in helpers]
        if not backs:
            continue
        here = [c for c in loop.calls if c in steps or (updaters and index.local_target(c) in updaters)]
        if here:
            mods = [_mod_guard(index, s, loop) for s in here]
            if any(m is None for m in mods):
                continue  # an optimizer step on every iteration: no accumulation
            free = tuple(b for b in backs if _mod_guard(index, b, loop) is None) or _both_branches(index, backs, loop)
            if free:
                found.append(Accumulation(loop, mods[0], free, tuple(here), "modulo"))  # type: ignore[arg-type]
            continue
        count = _range_count(getattr(loop.node, "iter", None))
        parent = loop.parent
        if parent is None:
            step = _step_after_in_function(index, loop, count, steps)
            if step:
                found.append(Accumulation(loop, count, tuple(backs), step, "inner-loop"))  # type: ignore[arg-type]
            continue
        if count is None:
            count = _pieces_of_the_batch(index, loop)
            if count is None:
                continue
        elif not (_ACCUM_NAME.search(dotted(count) or "") or isinstance(count, ast.Constant)
                  or _named_constant(index, count, loop.node)):
            continue  # `for task in range(n_tasks)`: several losses on purpose, not micro-batches
        end = (getattr(loop.node, "end_lineno", 0) or 0, 1 << 30)
        after = tuple(c for c in parent.calls if c in steps and _position(c) > end)
        if after:
            found.append(Accumulation(loop, count, tuple(backs), after, "inner-loop"))
    return found


def _update_helpers(index: Index) -> set[ast.AST]:
    """This file's functions that step an optimizer and run no backward (a trainer's `optimizer_step()`: clip,
    step, zero_grad): a loop that calls one under `if (i + 1) % n == 0` accumulates as if it stepped itself."""
    stepping = {index.function_of(c) for c in index.step_calls}
    if not stepping:
        return set()
    backing = {index.function_of(c) for c in index.backward_calls}
    return {fn for fn in stepping if fn is not None and fn not in backing}


def _both_branches(index: Index, backs: list[ast.Call], loop: Loop) -> tuple[ast.Call, ...]:
    """The backward calls of a loop that runs one in each branch of its accumulation test (`if
    is_accumulation_step: with model.no_sync(): loss.backward()` / `else: loss.backward(); opt.step()`): every
    micro-step runs a backward, though each one sits under the test."""
    if len(backs) < 2:
        return ()
    for b in backs:
        for anc, child in _between(index, b, loop.node):
            if isinstance(anc, ast.If) and anc.orelse and _find_mod(index, anc.test, anc) is not None:
                side = anc.body if child in anc.body else anc.orelse
                other = anc.orelse if side is anc.body else anc.body
                if any(_inside_statements(index, o, other) for o in backs if o is not b):
                    return tuple(backs)
    return ()


def _inside_statements(index: Index, node: ast.AST, body: list[ast.stmt]) -> bool:
    wanted = set(map(id, body))
    return any(id(anc) in wanted for anc in index.ancestors(node)) or id(node) in wanted


def _named_constant(index: Index, count: ast.expr, at: ast.AST) -> bool:
    """`k` for `for j in range(k)` where `k = 4`: a fixed count, read like the constant itself."""
    if not isinstance(count, ast.Name):
        return False
    value = _value_of(index, count.id, at)
    return isinstance(value, ast.Constant) and type(value.value) is int


def _step_after_in_function(index: Index, loop: Loop, count: ast.expr | None,
                            steps: set[ast.Call]) -> tuple[ast.Call, ...]:
    """A function that is one training step, called by a loop elsewhere (voicebox-pytorch's
    `VoiceBoxTrainer.train_step`: `for _ in range(self.grad_accum_every): ...; self.accelerator.backward(loss /
    self.grad_accum_every)`, then `self.optim.step()` once): its micro-step loop has no loop around it, and the
    optimizer steps after that loop in the function's own body. Only a `range(n)` count whose name says
    accumulation counts: with no step loop around it, `for i in range(30)` is as likely an inner optimisation
    (DomainBed's TRM fits its classifiers 30 times, stepping them in a nested loop) as micro-steps. A loop that
    steps an optimizer anywhere inside is not a micro-step loop."""
    if count is None or not _ACCUM_NAME.search(dotted(count) or ""):
        return ()
    fn = index.function_of(loop.node)
    if fn is None or any(c in steps for c in loop.all_calls()):
        return ()
    end = (getattr(loop.node, "end_lineno", 0) or 0, 1 << 30)
    return tuple(c for c in steps if index.function_of(c) is fn and index.loop_of(c) is None and _position(c) > end)


# -- autocast regions --------------------------------------------------------------------------


def _autocast_enabled(index: Index, region: AutocastRegion) -> bool:
    """False only when the autocast call says `enabled=False`."""
    call = region.call
    if call is None:
        return True
    q = index.resolve(call.func) or ""
    position = 0 if q.startswith(("torch.cuda.", "torch.cpu.")) else 2
    return not is_constant(kwarg(call, "enabled", position), False)


def autocast_regions(ctx: Context) -> list[AutocastRegion]:
    """`with autocast(...)` blocks and `@autocast(...)` functions (rules using this subscribe to ast.With)."""

    def build() -> list[AutocastRegion]:
        index = ctx.index
        regions = []
        for node in index.nodes(ast.With) + index.nodes(ast.AsyncWith) + index.nodes(ast.FunctionDef):
            if isinstance(node, FUNCTIONS) and not node.decorator_list:
                continue
            if not node.body:
                continue
            region = index.autocast_at(node.body[0])
            if region is not None and region.node is node:
                regions.append(region)
        return regions

    return ctx.memo("autocast-regions", build)


def _uses_a_scaler(ctx: Context) -> bool:
    """A GradScaler, or anything called like one (`self.scaler.scale(loss)`, timm's `loss_scaler(...)`)."""
    index = ctx.index
    return bool(
        index.bindings_of("scaler")
        or index.method_calls("unscale_")
        or any("scaler" in name.lower() or "loss_scale" in name for name in index.calls_by_name)
    )


# -- TD401 ---------------------------------------------------------------------------------------

_DEPRECATED_AMP = {
    "torch.cuda.amp.autocast": 'torch.autocast("cuda", ...)',
    "torch.cuda.amp.GradScaler": 'torch.amp.GradScaler("cuda", ...)',
    "torch.cuda.amp.custom_fwd": 'torch.amp.custom_fwd(device_type="cuda")',
    "torch.cuda.amp.custom_bwd": 'torch.amp.custom_bwd(device_type="cuda")',
    "torch.cpu.amp.autocast": 'torch.autocast("cpu", ...)',
    "torch.cpu.amp.GradScaler": 'torch.amp.GradScaler("cpu", ...)',
}


@rule("TD401", ast.Module)
def deprecated_amp_api(node: ast.Module, ctx: Context) -> None:
    if not ctx.torch_at_least(2, 4):
        return  # deprecated (a FutureWarning) since torch 2.4
    index = ctx.index
    used: list[tuple[ast.AST, ast.AST]] = []  # (where, the name used)
    for call in index.calls_to(*_DEPRECATED_AMP):
        used.append((call, call.func))
    for fn in index.nodes(ast.FunctionDef) + index.nodes(ast.AsyncFunctionDef):
        for d in fn.decorator_list:  # type: ignore[attr-defined]
            if isinstance(d, ast.Name | ast.Attribute) and index.resolve(d) in _DEPRECATED_AMP:
                used.append((d, d))  # a bare `@torch.cuda.amp.custom_bwd`
    for where, expr in used:
        if _compatibility_fallback(index, where):
            continue
        q = index.resolve(expr) or ""
        shown = ctx.segment(expr)
        via = "" if shown == q else f" (`{q}`)"
        ctx.report(where, variable=shown, via=via, call=q, new=_DEPRECATED_AMP[q])


_VERSION_TEST = re.compile(r"version|TORCH_\d|torch_\d|hasattr|is_torch_greater|is_torch_less|compat", re.I)


def _compatibility_fallback(index: Index, node: ast.AST) -> bool:
    """The old API kept for old torch only: in an `except` handler of a try that uses the new one, or in a
    branch of an `if` that tests the torch version (`if TORCH_2_4: ... else: torch.cuda.amp...`)."""
    for anc in index.ancestors(node):
        if isinstance(anc, ast.ExceptHandler):
            return True
        if isinstance(anc, ast.If | ast.IfExp) and _VERSION_TEST.search(ast.unparse(anc.test)):
            return True
        if isinstance(anc, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return False
    return False


# -- TD402 ---------------------------------------------------------------------------------------


_TORCH_SCALER = ('`scaler = torch.amp.GradScaler("cuda")`, then `scaler.scale(loss).backward()`, '
                 '`scaler.step(optimizer)`, `scaler.update()`; or use `dtype=torch.bfloat16` on GPUs that support it '
                 '(it needs no scaler)')


def _flag_values(index: Index, value: ast.AST) -> set[str] | None:
    """The strings a command-line flag can hold (`args.mixed_precision` <- `add_argument("--mixed_precision",
    default=..., choices=[...])`), or None when no `add_argument` of this file defines it."""
    attr = value.attr if isinstance(value, ast.Attribute) else None
    if attr is None:
        return None
    for call in index.method_calls("add_argument"):
        flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        dest = kwarg(call, "dest")
        names = {f.lstrip("-").replace("-", "_") for f in flags}
        if attr in names or (isinstance(dest, ast.Constant) and dest.value == attr):
            return {n.value for n in subtree(call) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return None


def _runner_float16(index: Index, ctx: Context) -> list[tuple[ast.Call, str, str]]:
    """Framework runners built with float16 mixed precision (vocabulary.toml [frameworks]: `precision_keyword`,
    `float16_values`): (constructor call, framework, how the dtype is known). A value read from a flag or config
    counts when the script itself offers a float16 value (`choices=["no", "fp16", "bf16"]`)."""
    found = []
    for framework, facts in index.vocab["frameworks"].items():
        for call in index.calls_to(*facts["constructors"]):
            value = kwarg(call, facts["precision_keyword"])
            if value is None:
                continue
            if isinstance(value, ast.Constant):
                if str(value.value) in facts["float16_values"]:
                    found.append((call, framework, "float16"))
                continue
            offered = _flag_values(index, value)
            if offered is None:  # a config value: any float16 spelling the script holds
                offered = {n.value for n in subtree(index.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            if offered & set(facts["float16_values"]):
                shown = ctx.segment(value, 40)
                values = " / ".join(f'"{v}"' for v in facts["float16_values"] if v in offered)
                found.append((call, framework, f"float16 when `{shown}` is {values} (a value this script offers)"))
    return found


def _plain_backward_under_runner(ctx: Context) -> None:
    """`accelerator = Accelerator(mixed_precision="fp16")` but `loss.backward()`: the prepared model's forward runs
    in float16 and only `accelerator.backward(loss)` scales the loss (med-seg-diff-pytorch #6)."""
    index = ctx.index
    runners = _runner_float16(index, ctx)
    if not runners:
        return
    for call, framework, dtype in runners:
        owner = index.function_of(call)
        for back in index.backward_calls:
            if is_engine_backward(back) or index.function_of(back) is not owner or index.grad_disabled(back):
                continue
            if not isinstance(back.func, ast.Attribute) or isinstance(back.func.value, ast.Call):
                continue  # `scaler.scale(loss).backward()`: scaled by hand
            stmt = index.parent(call)
            runner = (dotted(stmt.targets[0]) if isinstance(stmt, ast.Assign) else None) or framework
            loss = ctx.segment(back.func.value, 30)
            # A flag's value: float16 on the runs that pick it, so a warning rather than the rule's error.
            ctx.report(back, severity=None if dtype == "float16" else "warning", variable=ctx.segment(call, 60), dtype=dtype,
                       backward=f"`{ctx.segment(back, 40)}` (line {back.lineno}), not `{runner}.backward({loss})`,",
                       scale_with=f"call `{runner}.backward({loss})` instead of `{ctx.segment(back, 40)}`: it applies "
                                  f"the runner's GradScaler (and divides by the accumulation steps)")


@rule("TD402", ast.Module, ast.With, ast.AsyncWith)
def fp16_without_scaler(node: ast.AST, ctx: Context) -> None:
    if not isinstance(node, ast.Module):
        return
    index = ctx.index
    if not index.backward_calls:
        return
    if not _uses_a_scaler(ctx):
        _plain_backward_under_runner(ctx)
    if any(is_engine_backward(c) for c in index.backward_calls):
        return  # no training here, or a framework (Accelerate, DeepSpeed, Lightning) that scales for you
    regions = [r for r in autocast_regions(ctx) if r.dtype == "float16" and _autocast_enabled(index, r)]
    if not regions or _uses_a_scaler(ctx):
        return
    for region in regions:
        if index.grad_disabled(region.node):
            continue
        owner = region.node if isinstance(region.node, FUNCTIONS) else index.function_of(region.node)
        backs = [c for c in index.backward_calls if index.function_of(c) is owner]
        trains = backs or index.training_loop_of(region.node) is not None
        if isinstance(region.node, FUNCTIONS) and region.node.name == "forward":
            trains, backs = True, index.backward_calls[:1]  # an autocast forward: every training step runs it
        if not trains:
            continue
        call = region.call
        where = call if call is not None else region.node
        implicit = call is not None and kwarg(call, "dtype") is None and not (
            len(call.args) > 1 and (index.resolve(call.func) or "") in ("torch.autocast", "torch.amp.autocast")
        )
        dtype = "float16 (the CUDA default when no dtype is given)" if implicit else "float16"
        backward = f"`{ctx.segment(backs[0], 40)}` (line {backs[0].lineno})" if backs else "the backward pass"
        ctx.report(where, variable=ctx.segment(where, 60), dtype=dtype, backward=backward, scale_with=_TORCH_SCALER)


# -- TD403 ---------------------------------------------------------------------------------------

_CLIPS = (
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad_norm",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_",
)


def _scaler_method(index: Index, call: ast.Call, method: str) -> bool:
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr == method and index.kind_of(func.value) == "scaler"


@rule("TD403", ast.Module)
def clip_before_unscale(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    _hook_clipping(node, ctx)
    clips = index.calls_to(*_CLIPS)
    if not clips:
        return
    scaler_steps = [c for c in index.method_calls("step") if _scaler_method(index, c, "step")]
    if not scaler_steps:
        return
    unscales = [c for c in index.method_calls("unscale_") if _scaler_method(index, c, "unscale_")]
    for clip in clips:
        fn = index.function_of(clip)
        loop = index.loop_of(clip)
        # The scaler step later in the same iteration: in the clip's loop, or in a loop nested in it
        # (`for opt in self.optimizers: self.scaler.step(opt)` after the clip).
        later = [
            s for s in scaler_steps
            if index.function_of(s) is fn and _position(s) > _position(clip)
            and (index.loop_of(s) is loop or _nested_in(index, s, loop))
        ]
        if not later:
            continue
        scaler = later[0].func.value  # type: ignore[attr-defined]
        b = index.binding(scaler)
        if b is not None and b.call is not None:
            q = index.resolve(b.call.func) or ""
            enabled = kwarg(b.call, "enabled", 4 if q.startswith(("torch.cuda.", "torch.cpu.")) else 5)
            if is_constant(enabled, False):
                continue
        if any(index.function_of(u) is fn and _position(u) < _position(clip) for u in unscales):
            continue
        ctx.report(clip, variable=ctx.segment(clip.func), scaler=dotted(scaler) or "scaler", step_call=ctx.segment(later[0], 50))


def _clips_in_grad_hook(fn: ast.AST) -> bool:
    """`p.register_hook(lambda grad: clamp(grad, -c, c))`: a hook that clips each gradient as backward
    produces it, before any GradScaler.unscale_ can run."""
    for call in subtree(fn):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "register_hook"):
            continue
        hook = call.args[0] if call.args else None
        body = hook.body if isinstance(hook, ast.Lambda) else None
        if body is None and isinstance(hook, ast.Name):
            local = [d for d in subtree(fn) if isinstance(d, ast.FunctionDef) and d.name == hook.id]
            body = local[0] if local else None
        if body is not None and any(
            isinstance(n, ast.Call) and re.search(r"clamp|clip", last_name(n.func) or "", re.I) for n in subtree(body)
        ):
            return True
    return False


def _scales_losses(index: Index) -> str | None:
    """The name of a GradScaler the file builds (not switched off by a constant), else None."""
    for b in index.bindings_of("scaler"):
        if b.call is not None and is_constant(kwarg(b.call, "enabled"), False):
            continue
        return b.name
    return None


def _hook_clipping(node: ast.Module, ctx: Context) -> None:
    """Gradient clipping installed as backward hooks, in a file that scales its losses: the hooks clip the scaled
    gradients. Calls to a clipping function of another file are left for the project pass."""
    index = ctx.index
    # Only functions that hold a `register_hook` call are walked: a walk of every function cost an eighth of the
    # engine's time on torch's own sources (bench/bench_check_cpu.py)
    hooked = [c.lineno for c in index.method_calls("register_hook")]
    clipping = [f for f in node.body if isinstance(f, ast.FunctionDef)
                and any(f.lineno <= line <= (f.end_lineno or f.lineno) for line in hooked) and _clips_in_grad_hook(f)]
    for f in clipping:
        ctx.leave("clips-in-grad-hook", {"function": f.name})
    scaler = _scales_losses(index)
    if scaler is None:
        return
    local = {f.name for f in clipping}
    for key, calls in index.calls_by_name.items():
        name = key.rsplit(".", 1)[-1]
        if not re.search(r"clip", name, re.I):
            continue
        for call in calls:
            if name in local and isinstance(call.func, ast.Name):
                ctx.report(call, variable=ctx.segment(call.func), scaler=scaler, step_call="the backward pass")
            elif (q := index.callee(call)) and "." in q:
                ctx.leave("scales-and-calls-clipping", {"callee": q, "line": call.lineno, "col": call.col_offset + 1,
                                                         "variable": ctx.segment(call.func), "scaler": scaler})


@project("TD403")
def hook_clipping_across_files(proj: Project) -> list[ProjectHit]:
    """trainer.py scales its losses and calls `util.enable_gradient_clipping(model, c)`, whose body (util.py)
    registers a clamping hook on every parameter: the hooks see the scaled gradients."""
    clipping = {(f.module, fact["function"]) for f, fact in proj.facts("clips-in-grad-hook")}
    if not clipping:
        return []
    hits = []
    for f, fact in proj.facts("scales-and-calls-clipping"):
        if any((g.module, name) in clipping and g is not f for g, name in proj.defining(fact["callee"])):
            hits.append(ProjectHit(f.path, fact["line"], fact["col"], {
                "variable": fact["variable"], "scaler": fact["scaler"], "step_call": "the backward pass"}))
    return hits


@rule("TD416", ast.Module)
def unscale_twice(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    unscales = [c for c in index.method_calls("unscale_") if _scaler_method(index, c, "unscale_")]
    if not unscales:
        return
    resets = [c for m in ("step", "update") for c in index.method_calls(m) if _scaler_method(index, c, m)]
    seen: dict[tuple[int, str], ast.Call] = {}
    for call in sorted(unscales, key=_position):
        loop = index.loop_of(call)
        scaler = dotted(call.func.value)  # type: ignore[attr-defined]
        if loop is None or scaler is None:
            continue
        mine = [r for r in resets if dotted(r.func.value) == scaler and index.loop_of(r) is loop]  # type: ignore[attr-defined]
        if not mine:
            continue
        decided = _update_decided_after(index, call, loop, [r for r in mine if r.func.attr == "update"])  # type: ignore[attr-defined]
        if decided is not None:
            ctx.report(call, variable=ctx.segment(call, 50), when="whenever its branch is reached",
                       step_call=ctx.segment(decided[0], 50),
                       step_when=f"when `{ctx.segment(decided[1].test, 40)}` holds, a condition the iteration settles "
                                 "after the unscale (a skipped update leaves the optimizer marked as unscaled)")
            continue
        if index.guarded_in_loop(call, loop, rare=True):
            continue
        if all(index.guarded_in_loop(r, loop, rare=True) for r in mine):
            first = min(mine, key=_position)
            ctx.report(call, variable=ctx.segment(call, 50), when="on every micro-step",
                       step_call=ctx.segment(first, 50), step_when="on some of them (under a periodic condition)")
            continue
        opt = dotted(kwarg(call, "optimizer", 0)) or "?"
        key = (id(loop.node), f"{scaler}:{opt}")
        earlier = seen.get(key)
        if earlier is not None and not any(_position(earlier) < _position(r) < _position(call) for r in mine) \
                and not _exclusive(index, earlier, call):
            ctx.report(call, variable=ctx.segment(call, 50), when=f"a second time in the iteration (line {earlier.lineno})",
                       step_call=ctx.segment(min(mine, key=_position), 50), step_when="once per iteration")
        seen[key] = call


def _update_decided_after(index: Index, unscale: ast.Call, loop: Loop, updates: list[ast.Call]) -> tuple[ast.Call, ast.If] | None:
    """(the update, the `if` around it) when every `scaler.update()` of the loop sits under an `if` that
    starts after the unscale_, does not hold the unscale_ too, and tests a value the iteration assigns
    (`if not skip_step:` after a norm check sets `skip_step`): on an iteration where that test fails the
    scaler is unscaled but never updated. A test about the scaler or a fixed setting is not such a decision."""
    if not updates:
        return None
    built = index.binding(unscale.func.value)  # type: ignore[attr-defined]
    if built is not None and _inside(index, built.node, loop.node):
        return None  # a scaler built anew each iteration keeps no unscaled mark from the last one
    around = {id(a) for a in index.ancestors(unscale)}
    guards = [ast.dump(a.test) for a in index.ancestors(unscale) if isinstance(a, ast.If)]
    # Names the iteration binds (`skip_step = ...`, `a, b = ...`), not the objects whose attributes it sets:
    # `self.state.global_step += 1` does not make a test on `self.deepspeed` an in-iteration decision.
    assigned = {
        t.id for n in subtree(loop.node) if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for t in _bound_names(n.targets if isinstance(n, ast.Assign) else [n.target])
    }
    scaler = dotted(unscale.func.value)  # type: ignore[attr-defined]
    found = None
    for update in updates:
        deciding = None
        for anc, _child in _between(index, update, loop.node):
            if isinstance(anc, ast.Try):
                return None
            if not isinstance(anc, ast.If) or id(anc) in around or _position(anc) < _position(unscale):
                continue
            names = {n.id for n in subtree(anc.test) if isinstance(n, ast.Name)}
            if ast.dump(anc.test) in guards or any(dotted(n) == scaler for n in subtree(anc.test)):
                continue
            if names & assigned:
                deciding = anc
        if deciding is None:
            return None
        found = found or (update, deciding)
    return found


def _bound_names(targets: list[ast.expr]) -> list[ast.Name]:
    out: list[ast.Name] = []
    for t in targets:
        if isinstance(t, ast.Name):
            out.append(t)
        elif isinstance(t, ast.Tuple | ast.List):
            out += _bound_names(list(t.elts))
        elif isinstance(t, ast.Starred):
            out += _bound_names([t.value])
    return out


def _nested_in(index: Index, node: ast.AST, loop) -> bool:
    """`node` sits in a loop inside `loop` (or inside any loop of the function, when `loop` is None)."""
    around = index.loops_around(node)
    return bool(around) and (loop is None or loop in around[1:])


# -- TD404 ---------------------------------------------------------------------------------------


@rule("TD404", ast.Module, ast.With, ast.AsyncWith)
def scaler_with_bf16(node: ast.AST, ctx: Context) -> None:
    if not isinstance(node, ast.Module):
        return
    index = ctx.index
    scalers = [b for b in index.bindings_of("scaler") if b.call is not None]
    if not scalers:
        return
    regions = [r for r in autocast_regions(ctx) if _autocast_enabled(index, r)]
    if not regions or any(r.dtype != "bfloat16" for r in regions):
        return
    for b in scalers:
        q = index.resolve(b.call.func) or ""  # type: ignore[union-attr]
        enabled = kwarg(b.call, "enabled", 4 if q.startswith(("torch.cuda.", "torch.cpu.")) else 5)  # type: ignore[arg-type]
        if enabled is not None and not is_constant(enabled, True):
            continue  # `enabled=(dtype == "float16")`: switched off for bf16 already
        ctx.report(b.call, variable=b.name, autocast=ctx.segment(regions[0].call or regions[0].node, 60))  # type: ignore[arg-type]


# -- TD405 ---------------------------------------------------------------------------------------


@rule("TD405", ast.Module)
def backward_in_autocast(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in index.backward_calls:
        region = index.autocast_at(call)
        if region is None or not _autocast_enabled(index, region):
            continue
        opened = region.call if region.call is not None else region.node
        ctx.report(call, variable=ctx.segment(call, 50), autocast=ctx.segment(opened, 50), line=region.node.lineno)


# -- schedulers ----------------------------------------------------------------------------------

_HF_FACTORY = re.compile(r"^transformers\.(?:optimization\.)?get_\w*schedule\w*$|^transformers\.get_scheduler$")


@dataclass(frozen=True)
class Schedule:
    name: str  # the variable: "scheduler", "self.sched"
    cls: str  # OneCycleLR, CosineAnnealingLR, LambdaLR, get_cosine_schedule_with_warmup, ...
    call: ast.Call  # the constructor or factory call
    via: ast.FunctionDef | ast.AsyncFunctionDef | None = None  # a local factory function that builds it

    def arg(self, name: str, position: int | None = None) -> ast.expr | None:
        return kwarg(self.call, name, position)


def schedules(ctx: Context) -> dict[str, Schedule]:
    """Scheduler variables by name, each with its latest construction in the file."""
    return ctx.memo("schedules", lambda: {name: built[-1][1] for name, built in _all_schedules(ctx).items()})


def _all_schedules(ctx: Context) -> dict[str, list[tuple[ast.AST, Schedule]]]:
    """Every construction of each scheduler variable, with its statement, in source order: direct constructions
    and calls of local factory functions."""
    return ctx.memo("schedules:all", lambda: _schedules(ctx.index))


def schedules_at(ctx: Context, call: ast.Call) -> list[Schedule]:
    """The schedules that may be what `name.step()` steps at this call, latest first: a later cell's or a later
    function's construction under the same name is not this one's."""
    built = _all_schedules(ctx).get(dotted(call.func.value) or "")  # type: ignore[attr-defined]
    if not built:
        return []
    return ctx.index.reaching_statements(built, call, built[0][1].name)


# torch schedulers whose length is a named argument of their own constructor (a factory that returns one hands its
# parameters to those arguments)
_SIZED_BY_ARGUMENTS = frozenset({"StepLR", "MultiStepLR", "CosineAnnealingLR", "ExponentialLR", "ReduceLROnPlateau",
                                 "OneCycleLR", "CyclicLR", "LinearLR", "CosineAnnealingWarmRestarts", "PolynomialLR"})


def _scheduler_call(index: Index, expr: ast.AST | None) -> str | None:
    if not isinstance(expr, ast.Call):
        return None
    q = index.resolve(expr.func) or ""
    n = index.names
    if q in n["scheduler_factories"] or any(q.startswith(p) for p in n["scheduler_prefixes"]):
        return q
    return None


def _schedules(index: Index) -> dict[str, list[tuple[ast.AST, Schedule]]]:
    table: dict[str, list[tuple[ast.AST, Schedule]]] = {}
    stepped = {dotted(c.func.value) for c in index.method_calls("step")}  # type: ignore[attr-defined]
    stepped.discard(None)
    if not stepped:
        return table
    for b in index.bindings_of("scheduler"):
        value = getattr(b.node, "value", None)
        if isinstance(value, ast.Call) and value is not b.call and isinstance(value.func, ast.Name) \
                and value.func.id in index.functions:
            continue  # built by a local factory: read below, with the factory's own arguments
        if b.call is not None and b.cls and b.name in stepped:
            table.setdefault(b.name, []).append((b.node, Schedule(b.name, b.cls.rsplit(".", 1)[-1], b.call)))
    built: dict[str, list[tuple[str, ast.Call]]] = {}  # local factory function -> the schedulers it may return
    for stmt in index.nodes(ast.Assign):
        value = stmt.value  # type: ignore[attr-defined]
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in index.functions):
            continue
        names = [n for n in map(dotted, stmt.targets) if n in stepped and n not in table]  # type: ignore[attr-defined]
        if not names:
            continue
        fn = index.functions[value.func.id]
        if fn.name not in built:
            returned = [
                n.value
                for n in subtree(fn)
                if isinstance(n, ast.Return) and n.value is not None and index.function_of(n) is fn
            ]
            kinds = [(_scheduler_call(index, r), r) for r in returned]
            # A factory that picks the schedule by name (`if name == "onecycle": return OneCycleLR(...)`, else
            # `return LinearLR(...)`) may return each: every one is a schedule the step may advance. One return that
            # is not a scheduler (a project class, `None`) leaves the whole choice unknown.
            built[fn.name] = [(q, r) for q, r in kinds if q is not None] \
                if kinds and all(q is not None for q, _ in kinds) else []
        for q, returned_call in built[fn.name]:
            cls = q.rsplit(".", 1)[-1]
            for name in names:
                if cls in _SIZED_BY_ARGUMENTS:
                    # its length is its own arguments, in the factory's terms (`T_max=epochs`): read there, with
                    # the factory's parameters followed to what this file's calls hand in
                    schedule = Schedule(name, cls, returned_call)  # type: ignore[arg-type]
                else:  # a lambda or a library factory: its length is read from the factory call's arguments
                    schedule = Schedule(name, cls, value, fn)
                table.setdefault(name, []).append((stmt, schedule))
    for built_here in table.values():
        built_here.sort(key=lambda p: _position(p[0]))
    return table


def _scheduler_steps(ctx: Context) -> list[tuple[ast.Call, Schedule]]:
    """(step call, the schedule it steps) for every scheduler step; a step some of whose constructions are in
    branches appears once for each construction that may reach it."""
    found = []
    for call in ctx.index.method_calls("step"):
        for s in schedules_at(ctx, call):
            found.append((call, s))
    return found


def _epoch_loop_count(ctx: Context, loop: Loop) -> tuple[float | None, str | None]:
    """(number, source text) of the epochs an epoch loop runs: `range(E)` / `range(start, E)`."""
    it = getattr(loop.node, "iter", None)
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and it.args):
        return None, None
    if len(it.args) == 1:
        return number(ctx, it.args[0], loop.node), ctx.segment(it.args[0], 30)
    start, stop = number(ctx, it.args[0], loop.node), number(ctx, it.args[1], loop.node)
    text = f"{ctx.segment(it.args[1], 30)} - {ctx.segment(it.args[0], 20)}"
    if is_constant(it.args[0], 0):
        text = ctx.segment(it.args[1], 30)
    return (stop - start if start is not None and stop is not None else None), text


def _epoch_count(ctx: Context) -> tuple[float | None, str | None]:
    """The epoch count of the file's first training epoch loop over a range()."""
    for loop in ctx.index.epoch_loops():
        if loop.trains:
            n, text = _epoch_loop_count(ctx, loop)
            if text is not None:
                return n, text
    return None, None


def _granularity(index: Index, call: ast.Call) -> tuple[str, Loop] | None:
    loop = index.loop_of(call)
    if loop is None:
        return _granularity_of_callers(index, call)
    if loop.kind not in ("batch", "epoch") or loop.full_batch:
        return None  # full-batch training: every batch is an epoch, whatever the schedule counts
    return loop.kind, loop


def _granularity_of_callers(index: Index, call: ast.Call) -> tuple[str, Loop] | None:
    """A step outside any loop of its function (`def train_step(self, x, y): ...; self.scheduler.step()`) runs as
    often as the function is called: when every call of it in this file sits in loops of one kind (the batch loop of
    `train_epoch`), that kind, with the first caller's loop."""
    fn = index.function_of(call)
    callers = index.callers(fn) if fn is not None else []
    found = []
    for caller in callers:
        loop = index.loop_of(caller)
        if loop is None or loop.kind not in ("batch", "epoch") or loop.full_batch:
            return None
        found.append((loop.kind, loop))
    return found[0] if found and len({kind for kind, _ in found}) == 1 else None


def _shown(ctx: Context, expr: ast.AST, at: ast.AST) -> str:
    """`total_steps` -> "`total_steps` (= epochs * len(loader))" when the name has a visible value."""
    text = f"`{ctx.segment(expr, 40)}`"
    if isinstance(expr, ast.Name):
        value = _value_of(ctx.index, expr.id, at)
        if value is not None:
            text += f" (= {ctx.segment(value, 50)})"
    return text


def _warmup_steps(ctx: Context, s: Schedule) -> float | None:
    """The warm-up length of a warm-up schedule (`num_warmup_steps`, or a factory's `warmup*` parameter)."""
    expr = s.arg("num_warmup_steps", 2 if s.cls == "get_scheduler" else 1) if s.cls.startswith("get_") else None
    if s.via is not None:
        params = [a.arg for a in s.via.args.args]
        for i, param in enumerate(params):
            if "warmup" in param:
                expr = kwarg(s.call, param, i)
                break
    return number(ctx, expr, s.call) if expr is not None else None


def _batch_length(ctx: Context, s: Schedule, epochs: float | None) -> tuple[str, str, float | None] | None:
    """For a per-batch scheduler: (what it plans, in words; the plan's source text; its number of steps),
    or None when its length is not counted in batches."""
    index = ctx.index
    at = s.call
    if s.cls == "OneCycleLR":
        total = s.arg("total_steps", 2)
        per_epoch = s.arg("steps_per_epoch", 4)
        if total is not None:
            plan = _plan(units(index, total, at))
            n = number(ctx, total, at)
            if plan == "epoch" or (plan is None and (n is None or epochs is None or n <= epochs)):
                return None
            return "total_steps", _shown(ctx, total, at), n
        if per_epoch is None or is_constant(per_epoch, 1):
            return None
        e = s.arg("epochs", 3)
        n_e, n_p = number(ctx, e, at), number(ctx, per_epoch, at)
        text = f"`{ctx.segment(e, 20) if e is not None else 'epochs'} × {ctx.segment(per_epoch, 30)}` steps"
        return "epochs × steps_per_epoch", text, (n_e * n_p if n_e is not None and n_p is not None else None)
    if s.cls == "CyclicLR":
        up = s.arg("step_size_up", 3)
        if up is None:
            return "step_size_up", "a half-cycle of 2,000 steps (the default)", 2000.0
        plan = _plan(units(index, up, at))
        n = number(ctx, up, at)
        if plan == "epoch" or (plan is None and (n is None or epochs is None or n < epochs)):
            return None
        return "step_size_up", f"half-cycles of {_shown(ctx, up, at)} steps", n
    if s.cls in ("LambdaLR", "MultiplicativeLR") or s.via is not None or _HF_FACTORY.match(f"transformers.{s.cls}"):
        total = None
        if s.via is None and s.cls.startswith("get_"):
            total = s.arg("num_training_steps", 3 if s.cls == "get_scheduler" else 2)
        if total is not None:
            plan = _plan(units(index, total, at))
            n = number(ctx, total, at)
            if plan == "epoch" or (plan is None and (n is None or epochs is None or n <= epochs)):
                return None
            return "num_training_steps", _shown(ctx, total, at), n
        evidence: set[str] = set()
        parts: list[ast.AST] = [*s.call.args[1:], *(k.value for k in s.call.keywords)]
        shown = "a schedule counted in steps"
        for part in parts:
            found = units(index, part, at)
            if isinstance(part, ast.Name) and part.id in index.functions:
                found |= units(index, index.functions[part.id], at)
            if _plan(found) == "batch" and shown == "a schedule counted in steps" and not isinstance(part, ast.Lambda):
                shown = _shown(ctx, part, at) + " steps"
            evidence |= found
        if _plan(evidence) != "batch":
            return None
        return "its lambda", shown, None
    return None


@rule("TD406", ast.Module)
def per_batch_scheduler_stepped_per_epoch(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    _epoch_set_each_step(node, ctx)
    steps = _scheduler_steps(ctx)
    if not steps:
        return
    per_batch_names = {s.name for call, s in steps if (_granularity(index, call) or ("", None))[0] == "batch"}
    reported: set[ast.Call] = set()
    for call, s in steps:
        where = _granularity(index, call)
        if where is None or where[0] != "epoch" or s.name in per_batch_names or call in reported:
            continue
        e_num, e_text = _epoch_loop_count(ctx, where[1])
        length = _batch_length(ctx, s, e_num)
        if length is None:
            continue
        what, plan_text, planned = length
        share = e_num / planned if planned and e_num is not None else None
        if share is not None and planned is not None and e_num is not None:
            usage = (
                f"the run makes {_count_text(e_num)} scheduler steps where it plans {_count_text(planned)}: "
                f"{share:.1%} of the schedule"
            )
        else:
            per = re.search(r"len\([^()]*\)", plan_text)
            fraction = f"1/{per.group(0)}" if per else "a small fraction"
            if what == "epochs × steps_per_epoch":
                fraction = f"1/{ctx.segment(s.arg('steps_per_epoch', 4), 30)}"  # type: ignore[arg-type]
            steps = f"`{e_text}` scheduler steps" if e_text else "one scheduler step per epoch"
            usage = f"the run makes {steps} where it plans {plan_text}: {fraction} of the schedule"
        pct = number(ctx, s.arg("pct_start", 5), s.call) if s.arg("pct_start", 5) is not None else 0.3
        if s.cls == "OneCycleLR" and pct is not None and (share is None or share < pct):
            usage += f", so the learning rate never leaves the warm-up (the first {pct:.0%})"
        else:
            warmup = _warmup_steps(ctx, s)
            if warmup is not None and e_num is not None and e_num < warmup:
                usage += f", so the learning rate never leaves the {_count_text(warmup)}-step warm-up"
            elif "warmup" in s.cls or s.via is not None:
                usage += ", so it ends early in the schedule (often still in the warm-up)"
        values = dict(variable=s.name, scheduler=s.cls, usage=usage, stepped_per="epoch")
        if planned is not None:
            values["lr_steps_planned"] = round(planned)
        if e_num is not None:
            values["lr_steps_taken"] = round(e_num)
        reported.add(call)
        ctx.report(call, **values)
    _stepped_in_epoch_hook(ctx, _scheduler_steps(ctx), per_batch_names)


def _epoch_hook(index: Index, call: ast.Call) -> str | None:
    """The Lightning hook holding `call` when Lightning runs it once per epoch (vocabulary.toml
    `lightning_epoch_hooks`: `validation_epoch_end`, `on_train_epoch_end`, ...), in a LightningModule of this file
    (a class with a `training_step`, in a file that imports Lightning)."""
    fn = index.function_of(call)
    if not isinstance(fn, FUNCTIONS) or fn.name not in index.names["lightning_epoch_hooks"]:
        return None
    info = index.class_of(call)
    if info is None or info.method("training_step") is None:
        return None
    return fn.name if index.uses("lightning") or index.uses("pytorch_lightning") else None


def _stepped_in_epoch_hook(ctx: Context, steps: list[tuple[ast.Call, Schedule]], per_batch_names: set[str]) -> None:
    """hearai's GlossTranslationModel (before 90271af): a OneCycleLR sized in `max_epochs * steps_per_epoch` batches,
    stepped by hand in `validation_epoch_end`, which Lightning calls once per epoch."""
    index = ctx.index
    reported: set[ast.Call] = set()
    for call, s in steps:
        if s.name in per_batch_names or _granularity(index, call) is not None or call in reported:
            continue
        hook = _epoch_hook(index, call)
        if hook is None:
            continue
        length = _batch_length(ctx, s, None)
        if length is None:
            continue
        _what, plan_text, _planned = length
        usage = (f"Lightning calls `{hook}` once per epoch, so the run makes one scheduler step per epoch where it "
                 f"plans {plan_text}")
        reported.add(call)
        ctx.report(call, variable=s.name, scheduler=s.cls, usage=usage, stepped_per="epoch")


def _epoch_set_each_step(node: ast.Module, ctx: Context) -> None:
    """A LightningModule's `lr_scheduler_step` hook that calls `scheduler.step(epoch=self.current_epoch)` while
    `configure_optimizers` may register the scheduler with `"interval": "step"`: Lightning calls the hook on every
    batch, and each call sets the schedule to the epoch index, so a schedule sized in steps advances once per epoch."""
    for cls in (c for c in node.body if isinstance(c, ast.ClassDef)):
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        hook, configure = methods.get("lr_scheduler_step"), methods.get("configure_optimizers")
        if hook is None or configure is None or not _registers_step_interval(configure):
            continue
        for call in subtree(hook):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "step"):
                continue
            epoch = kwarg(call, "epoch", 0)
            if epoch is None or not _EPOCH_WORD.search(dotted(epoch) or ""):
                continue
            ctx.report(call, variable=ctx.segment(call.func.value, 30), scheduler="registered with interval \"step\"",
                       usage=f"the `lr_scheduler_step` hook passes `epoch={ctx.segment(epoch, 30)}`, so on every batch "
                             "the schedule is set back to the epoch index and a schedule sized in steps (OneCycleLR, "
                             "warm-up by steps) follows only its first epochs-many steps", stepped_per="epoch")


def _registers_step_interval(configure: ast.FunctionDef) -> bool:
    """`"interval": "step"` (or a choice that can be "step") in the dict configure_optimizers returns."""
    for d in subtree(configure):
        if not isinstance(d, ast.Dict):
            continue
        for k, v in zip(d.keys, d.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == "interval" and v is not None:
                if any(isinstance(c, ast.Constant) and c.value == "step" for c in subtree(v)):
                    return True
    return False


def _per_epoch_effect(ctx: Context, s: Schedule, epochs: float | None) -> str | None:
    """Why stepping this scheduler per batch is wrong, or None when its length may be in batches."""
    index = ctx.index
    at = s.call

    def epoch_sized(expr: ast.AST | None) -> bool:
        if expr is None:
            return False
        plan = _plan(units(index, expr, at))
        if plan is not None:
            return plan == "epoch"
        n = number(ctx, expr, at)
        return n is not None and epochs is not None and n <= epochs

    def amount(expr: ast.AST) -> str:
        n = number(ctx, expr, at)
        return _count_text(n) if n is not None else f"`{ctx.segment(expr, 30)}`"

    if s.cls == "CosineAnnealingLR":
        t_max = s.arg("T_max", 1)
        if t_max is None or not epoch_sized(t_max):
            return None
        return (
            f"`T_max={ctx.segment(t_max, 30)}` counts epochs, so the cosine reaches its minimum after "
            f"{amount(t_max)} batches instead of {amount(t_max)} epochs and then climbs back up: the schedule "
            "repeats about len(loader) times as often as planned"
        )
    if s.cls == "StepLR":
        size = s.arg("step_size", 1)
        if size is None or not epoch_sized(size):
            return None
        gamma = ctx.segment(s.arg("gamma", 2), 10) if s.arg("gamma", 2) is not None else "0.1"  # type: ignore[arg-type]
        return f"the learning rate is multiplied by {gamma} every {amount(size)} batches instead of every {amount(size)} epochs"
    if s.cls == "MultiStepLR":
        milestones = s.arg("milestones", 1)
        if milestones is None:
            return None
        declared = _option_default(ctx, milestones)  # `milestones=args.milestones`, `--milestones 60 120 160`
        listed = declared if isinstance(declared, ast.List | ast.Tuple) and declared.elts else milestones
        if not isinstance(listed, ast.List | ast.Tuple) or not listed.elts:
            if not epoch_sized(milestones):
                return None
            last = None
        elif not all(epoch_sized(m) for m in listed.elts):
            return None
        else:
            values = [number(ctx, m, at) for m in listed.elts]
            last = max(values) if all(v is not None for v in values) else None  # type: ignore[type-var]
        when = f"within the first {_count_text(last)} batches" if last is not None else "within the first batches"
        return (
            f"every milestone in `{ctx.segment(milestones, 30)}` passes {when}, so the learning rate reaches its "
            "final value early in the run"
        )
    if s.cls == "ExponentialLR":
        gamma = number(ctx, s.arg("gamma", 1), at)
        if gamma is None or not 0 < gamma <= 0.95:
            return None
        return f"the learning rate shrinks by {gamma:g} every batch: after 1,000 batches it is {gamma ** 1000:.1e} of its start"
    if s.cls == "ReduceLROnPlateau":
        patience = s.arg("patience", 3)
        n = number(ctx, patience, at) if patience is not None else 10.0
        if n is None or n >= 100:
            return None
        return (
            f"its patience ({_count_text(n)}) counts batches, so the learning rate is cut whenever "
            f"{_count_text(n + 1)} batches in a row fail to beat the best per-batch value seen, which with noisy "
            "batch values happens over and over"
        )
    return None


def _per_update_guard(index: Index, call: ast.Call, loop: Loop) -> bool:
    """True when `call` runs on every batch of `loop`, or on every optimizer update of an accumulation
    loop (under the same `if (i + 1) % n == 0` as the optimizer step), and under no other condition."""
    steps = set(index.step_calls)
    if not _inside(index, call, loop.node):
        # the step sits in a function the loop calls (`self.train_step(x, y)`): every update of that function, and
        # the function called on every iteration
        fn = index.function_of(call)
        callers = [c for c in index.callers(fn) if _inside(index, c, loop.node)] if fn is not None else []
        return bool(callers) and _every_update_in(index, call, fn, steps) and \
            all(_per_update_guard(index, c, loop) for c in callers)
    for anc, _child in _between(index, call, loop.node):
        if isinstance(anc, ast.If) and _updates_either_way(anc, steps):
            continue  # `if use_fp16: scaler.step(opt) ... else: opt.step(); sched.step()`: how to update, not whether
        if isinstance(anc, ast.If):
            mod = _find_mod(index, anc.test, anc)
            if mod is None or not any(c in steps for c in loop.calls if _inside(index, c, anc)):
                return False  # `if i == len(loader) - 1:`, `if step % eval_every == 0:`: not every update
            found = units(index, mod, anc)
            if "len" in found or "epoch" in found or "epoch" in (dotted(mod) or "").lower():
                return False  # `% len(loader)`, `% steps_per_epoch`: once per epoch
        elif isinstance(anc, ast.ExceptHandler | ast.Try):
            return False
    return True


def _every_update_in(index: Index, call: ast.Call, fn: ast.AST, steps: set[ast.Call]) -> bool:
    """Within its own function, `call` runs on every optimizer update: under no test but one that also holds the
    optimizer step (`if (self.micro + 1) % self.accum == 0: opt.step(); sched.step()`) or picks how to update."""
    for anc, _child in _between(index, call, fn):
        if isinstance(anc, ast.If) and _updates_either_way(anc, steps):
            continue
        if isinstance(anc, ast.If):
            if _find_mod(index, anc.test, anc) is None or not any(n in steps for n in subtree(anc)):
                return False
        elif isinstance(anc, ast.ExceptHandler | ast.Try):
            return False
    return True


def _updates_either_way(branch: ast.If, steps: set[ast.Call]) -> bool:
    """Both arms of the `if` take an optimizer step: the test picks the way of updating (a scaler or not, one
    library or another), and a scheduler step in either arm runs on every update all the same."""
    def steps_in(body: list[ast.stmt]) -> bool:
        return any(node in steps for stmt in body for node in subtree(stmt))
    return bool(branch.orelse) and steps_in(branch.body) and steps_in(branch.orelse)


def _inside(index: Index, node: ast.AST, container: ast.AST) -> bool:
    return any(anc is container for anc in index.ancestors(node))


@rule("TD407", ast.Module)
def per_epoch_scheduler_stepped_per_batch(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    _leave_schedule_crossings(ctx)
    steps = _scheduler_steps(ctx)
    if not steps:
        return
    epochs, _ = _epoch_count(ctx)
    reported: set[ast.Call] = set()
    for call, s in steps:
        if call in reported:
            continue
        where = _granularity(index, call)
        if where is None or where[0] != "batch" or not where[1].trains:
            continue
        if not _per_update_guard(index, call, where[1]):
            continue
        effect = _per_epoch_effect(ctx, s, epochs)
        if effect is None:
            continue
        reported.add(call)
        ctx.report(call, variable=s.name, scheduler=s.cls, effect=effect, stepped_per="batch")


# -- schedules that cross files -------------------------------------------------------------------
# The step's period is known where the scheduler is stepped, its length where it is built: two files when `main.py`
# hands it to `train(..., scheduler)` of `engine.py`, or `train.py` steps what `build_scheduler(...)` of
# `optim_factory.py` returns. Each file leaves its half (semantic/crossings.py gives the keys); the project passes of
# TD406 and TD407 join them.


def _leave_schedule_crossings(ctx: Context) -> None:
    index = ctx.index
    source = ctx.source
    if "sched" not in index.lowered() and "LR(" not in source:  # the file's text lowered once for every rule
        return
    stepped: set[ast.Call] = {call for call, _ in _scheduler_steps(ctx)}
    optimizer_steps = set(index.step_calls)
    for call in index.method_calls("step"):
        if call in stepped or call in optimizer_steps or call.args or call.keywords:
            continue
        receiver = dotted(call.func.value)  # type: ignore[attr-defined]
        b = index.binding(receiver)
        if receiver is None or (b.kind != "scheduler" if b is not None else not _SCHED_NAME.search(receiver)):
            continue
        where = _granularity(index, call)
        if where is None or not where[1].trains and where[0] == "batch":
            continue
        if where[0] == "batch" and not _per_update_guard(index, call, where[1]):
            continue
        came = crossings.arrival(index, receiver, call)
        if came is not None:
            ctx.leave("schedule-stepped", {"line": call.lineno, "col": call.col_offset + 1, "variable": receiver,
                                           "per": where[0], "from": came})
    epochs, _ = _epoch_count(ctx)
    # `_scheduler_call` accepts a call by the name `resolve` gives it, the name the calls index files it under:
    # the calls of the names it could accept, in the walk's order, not every call of the file
    n = index.names
    prefixes = tuple(n["scheduler_prefixes"])
    named = frozenset(q for q in index.calls_by_name if q in n["scheduler_factories"] or q.startswith(prefixes))
    for made in index.calls_named(named, frozenset()) if named else ():
        q = _scheduler_call(index, made)
        if q is None:
            continue
        cls = q.rsplit(".", 1)[-1]
        if cls not in _SIZED_BY_ARGUMENTS and not _HF_FACTORY.match(q):
            continue
        leaving = crossings.departures(index, made)  # type: ignore[arg-type]
        if not leaving:
            continue
        schedule = Schedule(cls, cls, made)  # type: ignore[arg-type]
        effect = _per_epoch_effect(ctx, schedule, epochs)
        length = _batch_length(ctx, schedule, None)
        if effect is None and length is None:
            continue
        ctx.leave("schedule-made", {"line": made.lineno, "scheduler": cls, "effect": effect,  # type: ignore[attr-defined]
                                    "plan": length[1] if length is not None else None, "to": leaving})


def _crossing_pairs(project: Project, per: str) -> Iterator[tuple[Any, dict, Any, dict]]:
    """(stepping file, its fact, building file, its fact) for each schedule stepped `per` batch or epoch in one file
    and built in another."""
    made = list(project.facts("schedule-made"))
    for f, step in project.facts("schedule-stepped"):
        if step["per"] != per:
            continue
        for g, built in made:
            if g.path != f.path and any(crossings.joined(project, f.path, step["from"], g.path, to) for to in built["to"]):
                yield f, step, g, built
                break


@project("TD407")
def per_epoch_scheduler_stepped_per_batch_across_files(project: Project) -> list[ProjectHit]:
    hits = []
    for f, step, g, built in _crossing_pairs(project, "batch"):
        if built["effect"] is not None:
            hits.append(ProjectHit(f.path, step["line"], step["col"], {
                "variable": step["variable"], "scheduler": built["scheduler"], "stepped_per": "batch",
                "effect": f"{built['effect']} (it is built at line {built['line']} of {g.path})"}))
    return hits


@project("TD406")
def per_batch_scheduler_stepped_per_epoch_across_files(project: Project) -> list[ProjectHit]:
    hits = []
    for f, step, g, built in _crossing_pairs(project, "epoch"):
        if built["plan"] is not None:
            hits.append(ProjectHit(f.path, step["line"], step["col"], {
                "variable": step["variable"], "scheduler": built["scheduler"], "stepped_per": "epoch",
                "usage": f"the run makes one scheduler step per epoch where it plans {built['plan']} (it is built "
                         f"at line {built['line']} of {g.path})"}))
    return hits


# -- TD408 ---------------------------------------------------------------------------------------

_SCHED_NAME = re.compile(r"sched", re.I)


@rule("TD408", ast.Module)
def scheduler_before_optimizer_step(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    _leave_plain_schedule_classes(ctx)
    if not index.method_calls("step"):
        return  # no scheduler step at all (the optimizer's may live in another file: `tnt.train(...)`)
    table = schedules(ctx)
    imported = _imported_schedule_classes(index)

    def emit(call: ast.Call, known: bool, **values: object) -> None:
        if known or not imported:
            ctx.report(call, **values)
        else:  # the schedule may be one of the project's own classes: the project pass decides
            ctx.leave("TD408", {"line": call.lineno, "col": call.col_offset + 1, "values": values, "classes": imported})

    steps = set(index.step_calls)
    trainers = {c for fn in index.training_functions for c in index.callers(fn)}
    for call in index.method_calls("step"):
        receiver = dotted(call.func.value)  # type: ignore[attr-defined]
        if receiver is None or call in steps:
            continue
        reaching = schedules_at(ctx, call) if receiver in table else []
        s = reaching[0] if reaching else None
        if s is None:
            if not _SCHED_NAME.search(receiver.rsplit(".", 1)[-1]) or call.args or call.keywords:
                continue
            if not isinstance(index.parent(call), ast.Expr) or _plain_schedule_class(index, call):
                continue  # `_new_lr = scheduler.step()`: torch's step returns None, so this is the project's own
        elif any(r.cls == "ReduceLROnPlateau" for r in reaching):
            continue  # steps on a metric; PyTorch does not check its order
        loop = index.loop_of(call)
        here = _position(call)
        if loop is None:
            # A wrapper that steps both (`def step(self): self.scheduler.step(); self.optimizer.step()`):
            # the order inside one function body is the order of every training step that calls it.
            fn = index.function_of(call)
            if fn is None:
                continue
            if steps and index.event_handler_point(fn) in index.vocab["call_sites"]["ignite_before_iterations"]:
                # an Ignite handler run when each epoch starts: before that epoch's first optimizer step, which the
                # engine's update function takes (reid-strong-baseline's `adjust_learning_rate` on EPOCH_STARTED)
                first = min(steps, key=_position)
                emit(call, s is not None, variable=receiver, optimizer_step=ctx.segment(first, 50),
                     line=first.lineno)
                continue
            mine: list[ast.AST] = [c for c in steps if index.function_of(c) is fn and index.loop_of(c) is None]
            # `def train(...): scheduler.step(); for x, y in loader: ... optimizer.step()` (called once per epoch):
            # the function's own training loop runs after the scheduler step.
            mine += [lp.node for lp in index.training_loops()
                     if lp.parent is None and index.function_of(lp.node) is fn and (lp.has_step or lp.trains)]
            if not mine or any(_position(c) < here for c in mine):
                continue
            later = [c for c in mine if not _exclusive(index, c, call)]
            if later:
                first = min(later, key=_position)
                shown = ctx.segment(first, 50) if isinstance(first, ast.Call) else f"the training loop at line {first.lineno}"
                emit(call, s is not None, variable=receiver, optimizer_step=shown, line=first.lineno)
            continue
        # Where this loop's iteration steps an optimizer: directly, through a training function of this
        # file, or in a nested training loop.
        updates: list[ast.AST] = [c for c in loop.calls if c in steps or c in trainers or _hands_training(index, c)]
        updates += [child.node for child in loop.children if child.trains]
        if any(_position(u) < here and not _exclusive(index, u, call) for u in updates):
            continue  # an optimizer step comes first in the iteration (not one in another branch)
        later = [u for u in updates if _position(u) > here and not _exclusive(index, u, call)]
        if not later:
            continue
        first = min(later, key=_position)
        shown = ctx.segment(first, 50) if isinstance(first, ast.Call) else f"the training loop at line {first.lineno}"
        emit(call, s is not None, variable=receiver, optimizer_step=shown, line=first.lineno)


_LR_BASE = re.compile(r"LRScheduler|lr_scheduler|LR$|Scheduler$")


def _plain_class(index: Index, cls: ast.ClassDef) -> bool:
    """A schedule class of its own (`class WarmupCosineSchedule(object)` with a `step` method): no torch
    scheduler among its bases, so PyTorch never checks the order of its steps."""
    if not any(isinstance(m, FUNCTIONS) and m.name == "step" for m in cls.body):
        return False
    return not any(_LR_BASE.search(index.resolve(b) or dotted(b) or "") for b in cls.bases)


def _leave_plain_schedule_classes(ctx: Context) -> None:
    """For the project pass: this file's schedule classes that are not torch schedulers."""
    for cls in ctx.index.nodes(ast.ClassDef):
        if _SCHED_NAME.search(cls.name) and _plain_class(ctx.index, cls):  # type: ignore[attr-defined, arg-type]
            ctx.leave("plain-schedule-class", cls.name)  # type: ignore[attr-defined]


def _imported_schedule_classes(index: Index) -> list[str]:
    """Qualified names of schedule classes from outside torch that this file constructs
    (`WarmupCosineSchedule(optimizer, ...)` from `src.utils.schedulers`, V-JEPA's evals)."""
    local = {c.name for c in index.nodes(ast.ClassDef)}  # type: ignore[attr-defined]
    found: list[str] = []
    if index.source.isascii() and "sched" not in index.lowered():
        return found  # no name holds `_SCHED_NAME`'s word
    for call in index.nodes(ast.Call):
        func = call.func  # type: ignore[attr-defined]
        name = last_name(func) or ""
        if not name[:1].isupper() or not _SCHED_NAME.search(name) or name in local:
            continue
        q = index.resolve(func)
        if q is None or q.startswith("torch.") or q == name:
            continue
        found.append(q)
    return sorted(set(found))


@project("TD408")
def scheduler_before_optimizer_step_in_project(proj: Project) -> list[ProjectHit]:
    """A schedule stepped before the optimizer in one file is the project's own class, defined in another with no
    torch scheduler base (V-JEPA: evals/.../eval.py builds src/utils/schedulers.py's WarmupCosineSchedule)."""
    hits: list[ProjectHit] = []
    for f, fact in proj.facts("TD408"):
        plain = all(any(name in g.facts.get("plain-schedule-class", []) for g, name in proj.defining(q))
                    for q in fact["classes"])
        if not plain:
            hits.append(ProjectHit(f.path, fact["line"], fact["col"], fact["values"]))
    return hits


def _plain_schedule_class(index: Index, call: ast.Call) -> bool:
    """`scheduler = WarmupCosineSchedule(optimizer, ...)` with the class defined in this file on no torch
    scheduler base: it sets the learning rate itself and PyTorch never checks the order of its `step()`."""
    receiver = call.func.value  # type: ignore[attr-defined]
    if not isinstance(receiver, ast.Name):
        return False
    classes = {c.name: c for c in index.nodes(ast.ClassDef)}  # type: ignore[attr-defined]
    for value in index.definitions(receiver.id, call):
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in classes:
            return not any(_LR_BASE.search(index.resolve(b) or dotted(b) or "") for b in classes[value.func.id].bases)
    return False


def _hands_training(index: Index, call: ast.Call) -> bool:
    """`tnt.train(model=net, dataloader=loader, optimizer=opt)`, a function of another module handed a model and
    its optimizer: it runs the optimizer steps of this iteration."""
    if index.local_target(call) is not None:
        return False  # a function of this file: `trainers` knows whether it trains
    values = [*call.args, *(k.value for k in call.keywords)]
    return any(isinstance(v, ast.Name | ast.Attribute) and index.kind_of(v) == "optimizer" for v in values) and \
        any(isinstance(v, ast.Name | ast.Attribute) and index.is_model(v) for v in values)


def _exclusive(index: Index, a: ast.AST, b: ast.AST) -> bool:
    """`a` and `b` sit in different branches of the same `if` (never both in one iteration)."""
    branch_of: dict[ast.AST, str] = {}
    child = a
    for anc in index.ancestors(a):
        if isinstance(anc, ast.If):
            branch_of[anc] = "body" if child in anc.body else "orelse"
        child = anc
    child = b
    for anc in index.ancestors(b):
        if isinstance(anc, ast.If) and anc in branch_of:
            return branch_of[anc] != ("body" if child in anc.body else "orelse")
        child = anc
    return False


# -- TD409 ---------------------------------------------------------------------------------------


def _divides_by(node: ast.AST, count: ast.expr) -> bool:
    target = dotted(count) or (repr(count.value) if isinstance(count, ast.Constant) else None)
    if target is None:
        return False
    for sub in subtree(node):
        right = None
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div | ast.FloorDiv):
            right = sub.right
        elif isinstance(sub, ast.AugAssign) and isinstance(sub.op, ast.Div):
            right = sub.value
        elif isinstance(sub, ast.Call) and last_name(sub.func) in ("div", "div_", "true_divide") and sub.args:
            right = sub.args[-1]
        if right is None:
            continue
        for part in subtree(right):
            text = dotted(part) or (repr(part.value) if isinstance(part, ast.Constant) else None)
            if text == target:
                return True
    return False


def _loss_divided(index: Index, acc: Accumulation, call: ast.Call) -> bool:
    """Any division in what the backward is called on, or in the loop's assignments of its names."""
    receiver: list[ast.AST] = list(call.args)
    if isinstance(call.func, ast.Attribute):
        receiver.append(call.func.value)
    names = {n.id for r in receiver for n in subtree(r) if isinstance(n, ast.Name)}
    for r in receiver:
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div | ast.FloorDiv | ast.Mult) for n in subtree(r)):
            return True
    for sub in subtree(acc.loop.node):
        if isinstance(sub, ast.AugAssign) and isinstance(sub.target, ast.Name) and sub.target.id in names:
            if isinstance(sub.op, ast.Div | ast.Mult):
                return True
        elif isinstance(sub, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in names for target in sub.targets for t in subtree(target)
        ):
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div | ast.Mult) for n in subtree(sub.value)):
                return True
    return False


@rule("TD409", ast.Module)
def accumulation_not_normalized(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for acc in accumulations(ctx):
        count = acc.count
        if _divides_by(index.function_of(acc.loop.node) or index.tree, count):
            continue
        target = dotted(count) or (repr(count.value) if isinstance(count, ast.Constant) else None)
        if target is None:
            continue
        passed = any(
            any((dotted(a) == target) for a in [*c.args, *(k.value for k in c.keywords)])
            for c in acc.loop.all_calls()
            if c not in acc.steps
        )
        if passed:
            continue  # the count goes into a helper: it may divide there
        for call in acc.backward:
            if _loss_divided(index, acc, call):
                break
            values = dict(variable=ctx.segment(call, 50), accum_expr=ctx.segment(count, 40))
            n = number(ctx, count, call)
            if n is not None and n == int(n):
                values["micro_steps"] = int(n)
            ctx.report(call, **values)
            break


# -- TD410 ---------------------------------------------------------------------------------------

_ZERO = re.compile(r"\bzero_grad\b|\.grad\s*=\s*None|\.grad(?:\.data)?\.zero_\(|_foreach_zero_|\.grad\s*=\s*torch\.zeros")


def _built_inside(index: Index, step: ast.Call, loop: Loop) -> bool:
    """The stepped optimizer is constructed inside `loop` itself."""
    opt = step.args[0] if step.args else step.func.value  # type: ignore[attr-defined]
    b = index.binding(opt)
    return b is not None and _inside(index, b.node, loop.node)


def _functions_by_name(index: Index) -> dict[str, list[ast.AST]]:
    table: dict[str, list[ast.AST]] = {}
    for fn in index.nodes(ast.FunctionDef) + index.nodes(ast.AsyncFunctionDef):
        table.setdefault(fn.name, []).append(fn)  # type: ignore[attr-defined]
    return table


def _clears_gradients(ctx: Context, nodes: list[ast.AST], depth: int = 0) -> bool:
    """Whether any of these subtrees (or a function of this file they call) clears gradients."""
    table = ctx.memo("functions-by-name", lambda: _functions_by_name(ctx.index))
    for node in nodes:
        end = getattr(node, "end_lineno", None) or getattr(node, "lineno", 1)
        text = "\n".join(ctx.lines[getattr(node, "lineno", 1) - 1 : end])
        if _ZERO.search(text):
            return True
        if depth >= 3:
            continue
        called: list[ast.AST] = []
        for sub in subtree(node):
            if isinstance(sub, ast.Call):
                target = ctx.index.local_target(sub)
                if target is not None:
                    called.append(target)
                    continue
                name = last_name(sub.func)
                if name in ("train", "eval") and isinstance(sub.func, ast.Attribute):
                    continue  # `m.train()`: a module's mode switch, not this file's `def train`
                if name and name in table:
                    called += table[name]
        if called and _clears_gradients(ctx, called, depth + 1):
            return True
    return False


def _optimizer_left_uncleared(index: Index, loop: Loop, steps: list[ast.Call]) -> ast.Call | None:
    """In a loop that steps several optimizers and clears them one by one (`optimizer_G.zero_grad()`), the step
    of one that nothing clears: a GAN's discriminator whose gradients pile up step over step."""
    stepped = {dotted(c.func.value): c for c in steps if index.kind_of(c.func.value) == "optimizer"}  # type: ignore[attr-defined]
    if len(stepped) < 2 or None in stepped:
        return None
    calls = list(loop.all_calls())
    cleared: set[str] = set()
    for c in calls:
        if isinstance(c.func, ast.Attribute) and c.func.attr == "zero_grad":
            receiver = dotted(c.func.value)
            if receiver not in stepped:
                return None  # `D.zero_grad()` on a model, or a name we cannot tie: it may clear any of them
            cleared.add(receiver)
    if not cleared or any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in subtree(loop.node)):
        return None  # gradients also handled by hand (`p.grad = None`)
    missing = [name for name in stepped if name not in cleared]
    return stepped[missing[0]] if len(missing) == 1 else None


@rule("TD410", ast.Module)
def missing_zero_grad(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    if not index.step_calls or not index.backward_calls:
        return
    backward = set(index.backward_calls)
    steps = set(index.step_calls)
    for loop in index.loops.values():
        here = [c for c in loop.calls if c in steps]
        if not here:
            continue
        if any(
            index.kind_of(c.func.value) == "optimizer" and (c.args or c.keywords)  # type: ignore[attr-defined]
            for c in here
        ):
            continue  # `optimizer.step(closure)` (L-BFGS): the closure clears and computes the gradients
        calls = list(loop.all_calls())
        if not any(c in backward for c in calls):
            continue
        if any(_built_inside(index, c, loop) for c in here):
            continue  # a fresh optimizer every iteration: a one-off update, not a training loop
        if _clears_gradients(ctx, [loop.node]):
            uncleared = _optimizer_left_uncleared(index, loop, here)
            if uncleared is not None:
                ctx.report(uncleared, variable=ctx.segment(uncleared.func.value, 40),  # type: ignore[attr-defined]
                           step_call=ctx.segment(uncleared, 40))
            continue
        step = here[0]
        optimizer = step.args[0] if step.args else step.func.value  # type: ignore[attr-defined]
        ctx.report(loop.node, variable=ctx.segment(optimizer, 40), step_call=ctx.segment(step, 40))
    _missing_zero_grad_through_calls(ctx, backward, steps)


def _missing_zero_grad_through_calls(ctx: Context, backward: set[ast.Call], steps: set[ast.Call]) -> None:
    """`while step < n: self.train_step(batch)` where `train_step` runs the backward (itself or through
    `forward_backward`) and `self.optimizers.step()`, and neither the loop nor anything it calls clears the
    gradients (a `zero_grad()` once before the loop does not count): reported at the step."""
    index = ctx.index
    for step in sorted(steps, key=lambda c: (c.lineno, c.col_offset)):
        if index.loop_of(step) is not None:
            continue  # the direct case above
        if isinstance(step.func, ast.Attribute) and index.kind_of(step.func.value) == "optimizer" \
                and (step.args or step.keywords):
            continue  # a closure step
        fn = index.function_of(step)
        if fn is None:
            continue
        loops = []
        for call in index.callers(fn):
            loop = index.loop_of(call)
            if loop is not None:
                loops.append(loop)
            else:  # one more level: `def train(): while ...: self.train_step()` through `self.run_step()`
                outer = index.function_of(call)
                loops += [index.loop_of(c) for c in (index.callers(outer) if outer is not None else [])
                          if index.loop_of(c) is not None]
        if not loops or not _reaches_backward(index, fn, backward, 0):
            continue
        if any(_clears_gradients(ctx, [lp.node]) for lp in loops) or _clears_gradients(ctx, [fn]):
            continue
        optimizer = step.args[0] if step.args else step.func.value  # type: ignore[attr-defined]
        ctx.report(step, variable=ctx.segment(optimizer, 40), step_call=ctx.segment(step, 40))


def _reaches_backward(index: Index, fn: ast.AST, backward: set[ast.Call], depth: int) -> bool:
    """The function runs a backward itself or through a function of this file it calls."""
    for call in index.calls_in(fn):
        if call in backward:
            return True
        target = index.local_target(call)
        if target is not None and depth < 2 and target is not fn and _reaches_backward(index, target, backward, depth + 1):
            return True
    return False


# -- TD411 / TD412 -------------------------------------------------------------------------------

_NORM_LAYERS = re.compile(r"(?:Layer|RMS|Group)Norm|Embedding|Transformer|MultiheadAttention")


def _transformer_style(ctx: Context, cls: str | None, depth: int = 0) -> bool:
    """A model with norms and embeddings: a local class whose tree builds LayerNorm/RMSNorm/GroupNorm/
    Embedding layers (or local classes named like norms), a torch Transformer, or a Hugging Face model."""
    if not cls or depth > 6:
        return False
    index = ctx.index
    info = index.classes.get(cls)
    if info is None:
        short = cls.rsplit(".", 1)[-1]
        return cls.startswith("transformers.") or (cls.startswith("torch.nn.") and bool(_NORM_LAYERS.search(short)))
    for sub in subtree(info.node):
        if isinstance(sub, ast.Call):
            q = index.resolve(sub.func) or dotted(sub.func) or ""
            if _NORM_LAYERS.search(q.rsplit(".", 1)[-1]):
                return True
            if q in index.classes and q != cls and _transformer_style(ctx, q, depth + 1):
                return True
    return False


def _optimizer_params(index: Index, call: ast.Call) -> ast.AST | None:
    """The model whose `.parameters()` are passed whole (no parameter groups), else None."""
    params = kwarg(call, "params", 0)
    if isinstance(params, ast.Call) and isinstance(params.func, ast.Name) and params.func.id in ("filter", "list"):
        params = params.args[-1] if params.args else None
    if isinstance(params, ast.Call) and isinstance(params.func, ast.Attribute) and params.func.attr == "parameters":
        return params.func.value
    return None


def _model_class(index: Index, model: ast.AST) -> str | None:
    if isinstance(model, ast.Name) and model.id == "self":
        info = index.class_of(model)
        return info.name if info is not None and info.is_module else None
    b = index.binding(model)
    return b.cls if b is not None and b.kind == "module" else None


@rule("TD411", ast.Module)
def weight_decay_on_all_parameters(node: ast.Module, ctx: Context) -> None:
    for call in ctx.index.calls_to("torch.optim.AdamW", "torch.optim.SGD"):
        _check_decay_groups(call, ctx)


def _check_decay_groups(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    q = index.callee(node)
    model = _optimizer_params(index, node)
    if model is None:
        return
    decay = kwarg(node, "weight_decay", 4)
    if decay is None:
        if q != "torch.optim.AdamW":
            return
        value = "0.01, AdamW's default"
    else:
        n = number(ctx, decay, node)
        if n == 0 or (n is None and isinstance(decay, ast.Constant)):
            return
        value = ctx.segment(decay, 30)
    if not _transformer_style(ctx, _model_class(index, model)):
        return
    ctx.report(node, variable=ctx.segment(node.func), model=ctx.segment(model, 30), weight_decay=value)


@rule("TD412", ast.Module)
def adam_with_weight_decay(node: ast.Module, ctx: Context) -> None:
    for call in ctx.index.calls_to("torch.optim.Adam"):
        _check_adam(call, ctx)


def _check_adam(node: ast.Call, ctx: Context) -> None:
    if is_constant(kwarg(node, "decoupled_weight_decay"), True):
        return  # decoupled decay: AdamW under another name
    decay = kwarg(node, "weight_decay", 4)
    n = number(ctx, decay, node)
    if n is None or n <= 0:
        return
    ctx.report(node, variable=ctx.segment(node.func), weight_decay=f"{n:g}", value=ctx.segment(decay, 30))  # type: ignore[arg-type]


# -- TD413 -------------------------------------------------------------------------------------


def _zero_grad_calls(loop: Loop) -> list[ast.Call]:
    return [c for c in loop.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "zero_grad"]


@rule("TD413", ast.Module)
def zero_grad_every_micro_step(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for acc in accumulations(ctx):
        if acc.style == "modulo":
            # zero_grad on every iteration of a loop whose optimizer steps only every n-th one
            wiped = [c for c in _zero_grad_calls(acc.loop) if _mod_guard(index, c, acc.loop) is None
                     and not any(isinstance(a, ast.If) for a, _ in _between(index, c, acc.loop.node))]
            wiped += _zero_grad_in_helpers(index, acc.loop)
        else:
            wiped = _zero_grad_calls(acc.loop)  # inside `for _ in range(n):` whose step comes after it
        for call in wiped:
            ctx.report(call, variable=ctx.segment(call.func.value, 40), step_call=ctx.segment(acc.steps[0], 40),  # type: ignore[attr-defined]
                       accum_expr=ctx.segment(acc.count, 40))
    _zero_grad_every_call(ctx)
    _zero_grad_inside_accumulate(ctx)
    _leave_update_helpers(ctx)


# An optimizer wrapper of another file (`class Updater: def backward(self, loss): self.optimizer.zero_grad();
# loss.backward()` / `def step(self): self.optimizer.step()`), used by a loop that calls `updater.backward(loss)` on
# every micro-step and `updater.step()` under `if (i + 1) % n == 0`: the zero_grad is in one file, the accumulation in
# another. The class's file says which methods clear and which step; the loop's file says which it calls every
# micro-step and which only every n-th; the project pass joins them by the class.


def _methods_holding(index: Index, calls: list[ast.Call]) -> dict[int, int]:
    """The methods of module-level classes that hold one of these calls, at any depth inside them: the method's id
    -> its class's id."""
    found: dict[int, int] = {}
    parents = index.parents
    for call in calls:
        node, parent = call, parents.get(call)
        while parent is not None and not isinstance(parent, ast.Module):
            node, parent = parent, parents.get(parent)
        if not isinstance(node, ast.ClassDef):
            continue  # not inside a module-level class
        inner: ast.AST = call  # the statement of the class's body that holds the call
        while parents.get(inner) is not node:
            inner = parents[inner]
        if isinstance(inner, FUNCTIONS):
            found[id(inner)] = id(node)
    return found


def _leave_update_helpers(ctx: Context) -> None:
    index = ctx.index
    source = ctx.source
    if "zero_grad" in source and "class " in source and index.method_calls("zero_grad"):
        # Only a method holding a `.zero_grad(...)` or `.step(...)` call adds to the fact, and only a class with
        # a `.zero_grad(...)` in one of its methods can leave it: those methods found from the calls index (going
        # up from each call), not by walking every method whose text says "step" (every optimizer of torch's).
        holding = _methods_holding(index, index.method_calls("zero_grad"))
        classes = set(holding.values())
        holding.update(_methods_holding(index, index.method_calls("step")))
        for cls in ctx.index.nodes(ast.ClassDef):
            if id(cls) not in classes or not isinstance(index.parent(cls), ast.Module):
                continue
            zeroes: dict[str, tuple[int, str]] = {}  # method -> (line, receiver) of its zero_grad
            steps: list[str] = []
            for fn in cls.body:  # type: ignore[attr-defined]
                if id(fn) not in holding:
                    continue  # neither call is in it: no walk (torch's own optim classes are many and long)
                for call in subtree(fn):
                    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                        continue
                    if call.func.attr == "zero_grad" and not any(isinstance(a, ast.If | ast.For | ast.While)
                                                                 for a, _ in _between(index, call, fn)):
                        zeroes.setdefault(fn.name, (call.lineno, ctx.segment(call.func.value, 40)))
                    elif call.func.attr == "step" and (call in index.step_calls or "optim" in (dotted(call.func.value) or "")):
                        steps.append(fn.name)
            if zeroes and steps:
                ctx.leave("update-helper", {"class": cls.name, "zeroes": zeroes, "steps": steps})  # type: ignore[attr-defined]
    if "%" not in source:
        return
    for loop in index.loops.values():
        by_receiver: dict[str, list[ast.Call]] = {}
        for call in loop.calls:
            if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
                by_receiver.setdefault(call.func.value.id, []).append(call)
        for receiver, calls in by_receiver.items():
            made = _value_of(index, receiver, loop.node)
            q = index.resolve(made.func) if isinstance(made, ast.Call) and index.local_target(made) is None else None
            if q is None or "." not in q or q.startswith("torch."):
                continue
            guarded = {c.func.attr: _mod_guard(index, c, loop) for c in calls}  # type: ignore[attr-defined]
            every = {c.func.attr: (c.lineno, c.col_offset + 1) for c in calls  # type: ignore[attr-defined]
                     if not any(isinstance(a, ast.If) for a, _ in _between(index, c, loop.node))}
            sometimes = {m: ctx.segment(mod, 40) for m, mod in guarded.items() if mod is not None}
            if sometimes and every:
                ctx.leave("update-helper-use", {"class": q, "variable": receiver, "every": every, "sometimes": sometimes})


@project("TD413")
def zero_grad_every_micro_step_across_files(project: Project) -> list[ProjectHit]:
    helpers = {(f.path, fact["class"]): fact for f, fact in project.facts("update-helper")}
    hits = []
    for f, use in project.facts("update-helper-use"):
        for g, local in project.defining(use["class"]):
            helper = helpers.get((g.path, local))
            if helper is None:
                continue
            stepping = [m for m in use["sometimes"] if m in helper["steps"]]
            clearing = [m for m in use["every"] if m in helper["zeroes"]]
            if stepping and clearing:
                line, col = use["every"][clearing[0]]
                at, receiver = helper["zeroes"][clearing[0]]
                hits.append(ProjectHit(f.path, line, col, {  # the message reads "`{variable}.zero_grad()` runs ..."
                    "variable": f"{use['variable']}.{clearing[0]}() → {receiver}",
                    "helper": f"line {at} of {g.path}",
                    "step_call": f"{use['variable']}.{stepping[0]}()",
                    "accum_expr": use["sometimes"][stepping[0]]}))
                break
    return hits


def _zero_grad_in_helpers(index: Index, loop: Loop) -> list[ast.Call]:
    """The zero_grad of a function of this file that the loop calls on every micro-step (`self.forward_backward(x,
    y)`, whose first line clears the gradients) and that takes no optimizer step itself: the clearing runs as
    often as the call."""
    steps = set(index.step_calls)
    found: list[ast.Call] = []
    for call in loop.calls:
        if any(isinstance(a, ast.If) for a, _ in _between(index, call, loop.node)):
            continue
        target = index.local_target(call)
        if not isinstance(target, FUNCTIONS) or any(n in steps for n in subtree(target)):
            continue
        found += [n for n in subtree(target) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr == "zero_grad" and index.function_of(n) is target
                  and not any(isinstance(a, ast.If | ast.For | ast.While) for a, _ in _between(index, n, target))]
    return found


def _zero_grad_inside_accumulate(ctx: Context) -> None:
    """`with accelerator.accumulate(model): optimizer.zero_grad(); ...; accelerator.backward(loss);
    optimizer.step()`: accelerate's optimizer skips zero_grad (and step) on the micro-steps that do not sync, so
    the one zero_grad that runs is on the sync step, before that step's backward: it clears what the earlier
    micro-steps accumulated (DiffSynth-Studio #1404, accelerate #616)."""
    index = ctx.index
    for acc in index.method_calls("accumulate"):
        block = index.parent(acc)
        with_stmt = index.parent(block) if isinstance(block, ast.withitem) else None
        if not isinstance(with_stmt, ast.With) or acc is not block.context_expr:  # type: ignore[union-attr]
            continue
        calls = sorted((c for c in subtree(with_stmt) if isinstance(c, ast.Call)
                        and index.function_of(c) is index.function_of(with_stmt)), key=lambda c: (c.lineno, c.col_offset))
        backs = [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "backward"]
        steps = [c for c in calls if c in set(index.step_calls)]
        if not backs or not steps:
            continue
        for call in calls:
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "zero_grad") \
                    or (call.lineno, call.col_offset) > (backs[0].lineno, backs[0].col_offset) \
                    or any(isinstance(a, ast.If) for a, _ in _between(index, call, with_stmt)):
                continue
            ctx.report(call, variable=ctx.segment(call.func.value, 40), step_call=ctx.segment(steps[0], 40),
                       accum_expr=f"`{ctx.segment(acc.func.value, 30)}`'s gradient_accumulation_steps")  # type: ignore[attr-defined]


def _zero_grad_every_call(ctx: Context) -> None:
    """The same bug in a function called once per batch (Lightning's `training_step` under manual
    optimisation): the step is guarded by `(batch_idx + 1) % n`, the zero_grad by nothing."""
    index = ctx.index
    steps = set(index.step_calls)
    # only functions that step an optimizer outside any loop of theirs
    candidates = {index.function_of(c) for c in steps if index.loop_of(c) is None} - {None}
    for fn in candidates:
        calls = [c for c in subtree(fn) if isinstance(c, ast.Call) and index.function_of(c) is fn
                 and index.loop_of(c) is None]
        mine = [c for c in calls if c in steps]
        backs = [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr in ("backward", "manual_backward")]
        if not mine or not backs:
            continue
        guards = [_fn_mod_guard(index, c, fn) for c in mine]
        if any(g is None for g in guards):
            continue
        for call in calls:
            if (isinstance(call.func, ast.Attribute) and call.func.attr == "zero_grad"
                    and not any(isinstance(a, ast.If) for a, _ in _between(index, call, fn))):
                ctx.report(call, variable=ctx.segment(call.func.value, 40), step_call=ctx.segment(mine[0], 40),
                           accum_expr=ctx.segment(guards[0], 40))  # type: ignore[arg-type]


def _fn_mod_guard(index: Index, node: ast.AST, fn: ast.AST) -> ast.expr | None:
    for anc, _ in _between(index, node, fn):
        if isinstance(anc, ast.If):
            mod = _find_mod(index, anc.test, anc)
            if mod is not None:
                return mod
    return None


# -- TD414 -------------------------------------------------------------------------------------

FP16_MAX = 65504.0
_FILL_METHODS = {"masked_fill": 1, "masked_fill_": 1, "fill_": 0, "new_full": 1}
_FILL_FUNCTIONS = {"torch.full": 1, "torch.full_like": 1}


def _module_constants(ctx: Context) -> dict[str, float]:
    """Names bound once, at module or class level, to a number: `INF = 1e12`, `NEG_INF = -1e9`."""
    def build() -> dict[str, float]:
        seen: dict[str, list[float | None]] = {}
        for stmt in ctx.index.nodes(ast.Assign):  # collected by the engine's one walk
            if not isinstance(ctx.index.scope_of(stmt), ast.Module | ast.ClassDef):
                continue
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    seen.setdefault(target.id, []).append(_literal(stmt.value, {}))
        return {k: v[0] for k, v in seen.items() if len(v) == 1 and v[0] is not None}
    return ctx.memo("module-constants", build)


def _literal(expr: ast.AST | None, constants: dict[str, float]) -> float | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, int | float) and not isinstance(expr.value, bool):
        return float(expr.value)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub | ast.UAdd):
        inner = _literal(expr.operand, constants)
        return None if inner is None else (-inner if isinstance(expr.op, ast.USub) else inner)
    if isinstance(expr, ast.Name):
        return constants.get(expr.id)
    if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "float"
            and len(expr.args) == 1 and isinstance(expr.args[0], ast.Constant) and isinstance(expr.args[0].value, str)):
        try:
            return float(expr.args[0].value)
        except ValueError:
            return None
    return None


@rule("TD414", ast.Call, callees=tuple(_FILL_FUNCTIONS), methods=tuple(_FILL_METHODS))
def fp16_overflowing_fill(node: ast.Call, ctx: Context) -> None:
    func = node.func
    position: int | None = None
    if isinstance(func, ast.Attribute) and func.attr in _FILL_METHODS:
        position = _FILL_METHODS[func.attr]
    else:
        name = ctx.index.callee(node)
        if name in _FILL_FUNCTIONS:
            position = _FILL_FUNCTIONS[name]
            dtype = dotted(kwarg(node, "dtype")) or ""
            if not dtype.endswith(("float16", "half")):
                return  # the default dtype (float32) or an explicit wider one holds the value
    if position is None:
        return
    arg = kwarg(node, "value", position)
    value = _literal(arg, _module_constants(ctx))
    if value is None or value != value or abs(value) in (float("inf"),) or abs(value) <= FP16_MAX:
        return
    ctx.report(node, value=ctx.segment(arg, 30), number=f"{value:g}", call=ctx.segment(func, 40))


# -- TD415 -------------------------------------------------------------------------------------


def _divided_for_accumulation(node: ast.AST) -> ast.expr | None:
    """`loss /= accum_steps` or `loss = loss / args.gradient_accumulation_steps`: the divisor."""
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
        divisor = node.value
    elif isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Div):
        divisor = node.value.right
    else:
        return None
    return divisor if _ACCUM_NAME.search(dotted(divisor) or "") else None


@rule("TD415", ast.Module)
def accumulation_not_applied(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    steps = set(index.step_calls)
    backward = set(index.backward_calls)
    accumulating = {id(acc.loop) for acc in accumulations(ctx)}
    for loop in index.loops.values():
        if id(loop) in accumulating or not loop.has_backward:
            continue
        here = [c for c in loop.calls if c in steps]
        if not here or any(_mod_guard(index, c, loop) is not None for c in here):
            continue
        if any(isinstance(a, ast.If) for c in here for a, _ in _between(index, c, loop.node)):
            continue  # the step runs under some condition we do not read
        if any(c in backward and is_engine_backward(c) for c in loop.calls):
            continue  # accelerator.backward / engine.backward: the framework accumulates
        for stmt in subtree(loop.node):
            divisor = _divided_for_accumulation(stmt)
            if divisor is not None and index.loop_of(stmt) is loop:
                ctx.report(stmt, accum_expr=ctx.segment(divisor, 40), step_call=ctx.segment(here[0], 40))
                break

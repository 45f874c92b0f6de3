"""Find the line that makes a variable grow: `name += …`, `name = name + …`, `name.append(…)`.

The memory probe knows which variable holds a growing graph or list, and the
frame (file, function, current line) it lives in; this module reads that
file's syntax tree — never executes it — to point at the statement that
accumulates into the variable, preferring one inside the loop that encloses
the frame's current line.
"""

from __future__ import annotations

import ast
import linecache
from functools import lru_cache

from torchdoctor.rules.static.semantic.syntax import ACCUMULATION_NAME, dotted

GROWING_METHODS = {"append", "extend", "insert", "appendleft", "extendleft", "add", "update", "setdefault"}
# in-place tensor ops that chain a graph-holding argument onto the tensor they modify (`total.add_(loss)`)
IN_PLACE_GROWING = {"add_", "sub_", "mul_", "div_", "addcmul_", "addcdiv_", "lerp_", "copy_"}


@lru_cache(maxsize=64)
def _tree(path: str) -> ast.Module | None:
    # through linecache: a notebook cell ('train.ipynb:cell 3') is there, not on disk (probes/notebook.py)
    try:
        return ast.parse("".join(linecache.getlines(path)), filename=path)
    except (SyntaxError, ValueError):
        return None


def _matches(node: ast.AST, name: str) -> bool:
    """`node` is the expression `name` (a plain name or `self.attr`)."""
    head, _, attr = name.partition(".")
    if attr:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == attr
            and isinstance(node.value, ast.Name)
            and node.value.id == head
        )
    return isinstance(node, ast.Name) and node.id == name


def _mentions(node: ast.AST, name: str) -> bool:
    return any(_matches(n, name) for n in ast.walk(node))


def _scope(tree: ast.Module, firstlineno: int | None, function: str | None) -> ast.AST:
    if function in (None, "<module>") or firstlineno is None:
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if first == firstlineno or node.lineno == firstlineno:
                return node
    return tree


def class_scope(tree: ast.Module, name: str) -> ast.AST | None:
    """The body of the (first) class of that name."""
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def attribute_line(path: str, class_name: str, attribute: str) -> int | None:
    """The line of class `class_name` where `self.<attribute>` grows (a callback's `self.losses.append(loss)`)."""
    tree = _tree(path)
    scope = class_scope(tree, class_name) if tree is not None else None
    if scope is None:
        return None
    found = _candidates(scope, f"self.{attribute}")
    return min(found, key=lambda pn: (pn[0], pn[1].lineno))[1].lineno if found else None


def _walk_scope(scope: ast.AST):
    """Nodes of a scope, not descending into nested functions or classes (other namespaces)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _candidates(scope: ast.AST, name: str) -> list[tuple[int, ast.stmt]]:
    """(priority, statement): 0 for `+=` and `.append(`, 1 for `x = x + …`, 2 for `x[k] = …`."""
    found: list[tuple[int, ast.stmt]] = []
    walker = ast.walk(scope) if "." in name else _walk_scope(scope)
    for node in walker:
        if isinstance(node, ast.AugAssign) and _matches(node.target, name):
            found.append((0, node))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr in GROWING_METHODS | IN_PLACE_GROWING \
                    and _matches(func.value, name):
                found.append((0, node))
            elif isinstance(func, ast.Attribute) and func.attr in GROWING_METHODS \
                    and isinstance(func.value, ast.Subscript) and _matches(func.value.value, name):
                found.append((1, node))  # one list of a dict of lists grows: `running[metric].append(value)`
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if _matches(target, name) and _mentions(node.value, name):
                    found.append((1, node))
                elif isinstance(target, ast.Subscript) and _matches(target.value, name):
                    found.append((2, node))
    return found


def _loops_around(scope: ast.AST, line: int | None) -> list[ast.AST]:
    if line is None:
        return []
    loops = [
        n
        for n in ast.walk(scope)
        if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
        and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]
    return sorted(loops, key=lambda n: (n.end_lineno or n.lineno) - n.lineno)  # innermost first


def accumulation_line(
    path: str, name: str, current_line: int | None = None, firstlineno: int | None = None, function: str | None = None
) -> int | None:
    """The line where `name` grows, in the function (or module) the frame belongs to."""
    tree = _tree(path)
    if tree is None:
        return None
    scope = _scope(tree, firstlineno, function)
    found = _candidates(scope, name)
    if not found:
        return None
    for loop in _loops_around(scope, current_line):
        inside = [(p, n) for p, n in found if loop.lineno <= n.lineno <= (loop.end_lineno or loop.lineno)]
        if inside:
            return min(inside, key=lambda pn: (pn[0], pn[1].lineno))[1].lineno
    return min(found, key=lambda pn: (pn[0], pn[1].lineno))[1].lineno


def _root_name(node: ast.AST) -> str | None:
    """The name an expression starts from: `stats` in `stats.device_stat("loss")` or `stats.totals["loss"]`."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def in_place_line(path: str, head: str, current_line: int | None = None, firstlineno: int | None = None,
                  function: str | None = None) -> int | None:
    """The line of the frame's code that grows, in place, a tensor reached from the object `head`
    (`stats.device_stat("loss").add_(loss)`): the object's class only made the tensor; this call chains every
    step's graph onto it. Prefers a call inside the loop around the frame's current line."""
    tree = _tree(path)
    if tree is None:
        return None
    scope = _scope(tree, firstlineno, function)
    found = _in_place_calls(_walk_scope(scope), head)
    if found:
        for loop in _loops_around(scope, current_line):
            inside = [n for n in found if loop.lineno <= n.lineno <= (loop.end_lineno or loop.lineno)]
            if inside:
                return min(n.lineno for n in inside)
        return min(n.lineno for n in found)
    # The object was found in a helper the loop handed it to (`take_optimizer_step(optimizer, model, stats)`):
    # the call may be in the loop's code, anywhere in the file, under the same name; only when there is one.
    # Not for `self`: in another function it is another object (a meter's own `self.n += n`).
    if head in ("self", "cls"):
        return None
    found = _in_place_calls(ast.walk(tree), head)
    return found[0].lineno if len(found) == 1 else None


def _in_place_calls(nodes, head: str) -> list[ast.stmt]:
    found = []
    for node in nodes:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr in IN_PLACE_GROWING and _root_name(func.value) == head:
                found.append(node)
        elif isinstance(node, ast.AugAssign) and not isinstance(node.target, ast.Name) \
                and _root_name(node.target) == head:
            found.append(node)
    return sorted(found, key=lambda n: n.lineno)


def sync_switch_line(path: str, function: str | None, backward_line: int | None) -> int | None:
    """The line that turned DDP's gradient sync off for a backward that no all-reduce reached:
    `model.require_backward_grad_sync = ...` in the backward's own function (a schedule sets it once before its
    loop, far from the backward). Prefers an assignment of a false constant before the backward, else the
    nearest assignment before it; None when the function assigns the flag nowhere."""
    tree = _tree(path)
    if tree is None or backward_line is None:
        return None
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.name == function and n.lineno <= backward_line <= (n.end_lineno or n.lineno)]
    scope = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if scopes else tree
    switches = [n for n in _walk_scope(scope) if isinstance(n, ast.Assign) and n.lineno <= backward_line
                and any(isinstance(t, ast.Attribute) and t.attr == "require_backward_grad_sync" for t in n.targets)]
    if not switches:
        return None
    off = [n for n in switches if isinstance(n.value, ast.Constant) and not n.value.value]
    return max(n.lineno for n in (off or switches))


def op_line(places: list[tuple[str, int | None, str | None]], syntax: list[str],
            ran: set[tuple[str, int]] | None = None, operands: list[str] | None = None) -> tuple[str, int] | None:
    """The one line, across the script's loss code (`places`: file, first line, function), that writes an op
    spelled by `syntax`: "/" (a division), "**", or a call or method name (`log`, `cross_entropy`). `ran`: when
    given, only lines that ran a torch op in the watched step count. None when no line or several lines do: the
    analysis never picks between them."""
    lines: set[tuple[str, int]] = set()
    names = {s for s in syntax if s.isidentifier()}
    binops = {"/": ast.Div, "//": ast.FloorDiv, "**": ast.Pow, "*": ast.Mult}
    wanted = tuple(binops[s] for s in syntax if s in binops)
    feeds: dict[tuple[str, int], set[str]] = {}  # line -> the calls written in the matched op's own operands
    for path, firstlineno, function in places:
        tree = _tree(path)
        if tree is None:
            continue
        scope = _scope(tree, firstlineno, function)
        for node in _walk_scope(scope):
            if wanted and isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, wanted):
                lines.add((path, node.lineno))
                feeds.setdefault((path, node.lineno), set()).update(_called_names(node))
            elif isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
                if name in names:
                    lines.add((path, node.lineno))
                    feeds.setdefault((path, node.lineno), set()).update(_called_names(node) - {name})
    if ran is not None:
        lines &= ran
    if len(lines) > 1 and operands:
        # several lines write the op (`a * b` is everywhere): the one whose operands call what the graph shows
        # making the op's inputs (`torch.exp(logps) * logps` for a Mul of an Exp)
        fed = {line for line in lines if feeds.get(line, set()) & set(operands)}
        lines = fed or lines
    return next(iter(lines)) if len(lines) == 1 else None


def _called_names(node: ast.AST) -> set[str]:
    out = set()
    for leaf in ast.walk(node):
        if isinstance(leaf, ast.Call):
            func = leaf.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name:
                out.add(name)
    return out


def static_callees(places: list[tuple[str, int | None, str | None]], depth: int = 3,
                   limit: int = 12, imports: bool = False) -> list[tuple[str, int, str]]:
    """The functions of the same files that the loss code calls by name, to `depth` calls down: `helper(...)`
    for a module-level `def helper`, `self.method(...)` for a method of the class around the caller. Where a
    non-finite value is made in a helper of a trainer's loss code before anything ran it under watch (the first
    step), these are the places its op may be written. With `imports`, also the module-level functions a file
    imports from the project's own files beside it (`from losses import dice_loss`, `import utils as U;
    U.dice_loss(...)`): a loss helper usually lives in a module of its own."""
    out: list[tuple[str, int, str]] = []
    seen = {(p, f) for p, _, f in places}
    frontier = list(places)
    for _ in range(depth):
        nxt = []
        for path, firstlineno, function in frontier:
            tree = _tree(path)
            if tree is None:
                continue
            scope = _scope(tree, firstlineno, function)
            module_defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            owner = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and scope in c.body), None)
            methods = {n.name: n for n in owner.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} \
                if owner is not None else {}
            names, modules = _project_imports(path, tree) if imports else ({}, {})
            for node in _walk_scope(scope):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                target = None
                where = path
                if isinstance(func, ast.Name):
                    target = module_defs.get(func.id)
                    if target is None and func.id in names:
                        where, target = names[func.id]
                elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                    target = methods.get(func.attr)
                elif isinstance(func, ast.Attribute) and dotted(func.value) in modules:
                    where = modules[dotted(func.value)]
                    target = _module_functions(where).get(func.attr)
                if target is None or (where, target.name) in seen or len(out) >= limit:
                    continue
                seen.add((where, target.name))
                place = (where, target.lineno, target.name)
                out.append(place)
                nxt.append(place)
        frontier = nxt
    return out


def _module_functions(path: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = _tree(path)
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} if tree else {}


def _project_file(base: str, module: str | None, level: int) -> str | None:
    """The file of an imported module when it is one of the project's own (beside the importing file, or up
    `level - 1` folders for a relative import); None for anything installed or not found."""
    import os

    from torchdoctor.probes.userframes import is_library_file

    root = base
    for _ in range(max(level - 1, 0)):
        root = os.path.dirname(root)
    parts = module.split(".") if module else []
    for candidate in (os.path.join(root, *parts) + ".py", os.path.join(root, *parts, "__init__.py")):
        if parts and os.path.isfile(candidate) and not is_library_file(candidate):
            return candidate
    return None


def _project_imports(path: str, tree: ast.Module) -> tuple[dict[str, tuple[str, ast.AST]], dict[str, str]]:
    """What a file imports from the project's own modules at its top level: {local name: (file, def)} for
    `from m import f`, {local name: file} for `import m as M` / `import m`."""
    import os

    base = os.path.dirname(os.path.realpath(path)) if not path.startswith("<") else ""
    names: dict[str, tuple[str, ast.AST]] = {}
    modules: dict[str, str] = {}
    if not base:
        return names, modules
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            found = _project_file(base, node.module, node.level)
            if found is None:
                continue
            defs = _module_functions(found)
            for alias in node.names:
                if alias.name in defs:
                    names[alias.asname or alias.name] = (found, defs[alias.name])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found = _project_file(base, alias.name, 0)
                if found is not None:
                    modules[alias.asname or alias.name] = found
    return names, modules


def config_key_line(path: str, line: int | None, keys: list[str]) -> int | None:
    """The line, in the function that holds `line` (a scheduler's construction), where a configuration mapping
    gives one of `keys`: `{"interval": "step"}` or `dict(interval="step")` — where a framework is told how often to
    step what that function builds. None when the function sets none of them, or sets them on several lines."""
    tree = _tree(path)
    if tree is None or line is None:
        return None
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.lineno <= line <= (n.end_lineno or n.lineno)]
    if not scopes:
        return None
    scope = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno)
    wanted = set(keys)
    lines: set[int] = set()
    for node in _walk_scope(scope):
        if isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and key.value in wanted:
                    lines.add(key.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            lines.update(kw.value.lineno for kw in node.keywords if kw.arg in wanted)
    return next(iter(lines)) if len(lines) == 1 else None


def last_assignment_line(path: str, function: str | None, firstlineno: int | None, names: list[str],
                         before: int | None) -> tuple[int, str] | None:
    """Of the plain names given, the one whose last assignment before line `before` comes first in the function
    (a straight-line loop body: the earliest of them made the others), and that assignment's line. Whole-name
    targets only (`x = …`, `x += …`, `x: T = …`, tuple unpacking), not `x[i] = …`; a name whose last assignment
    writes an infinity itself (`float("-inf")`, `torch.inf`: an attention mask) is non-finite by design and skipped."""
    tree = _tree(path)
    if tree is None or before is None:
        return None
    scope = _scope(tree, firstlineno, function)
    last: dict[str, int] = {}
    deliberate: dict[str, bool] = {}
    for node in _walk_scope(scope):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        end = getattr(node, "end_lineno", node.lineno) or node.lineno
        if end >= before:
            continue
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name) and leaf.id in names and isinstance(leaf.ctx, ast.Store) \
                        and node.lineno >= last.get(leaf.id, 0):
                    last[leaf.id] = node.lineno
                    deliberate[leaf.id] = node.value is not None and _writes_infinity(node.value)
    last = {name: line for name, line in last.items() if not deliberate.get(name)}
    if not last:
        return None
    name = min(last, key=lambda n: last[n])
    return last[name], name


def _writes_infinity(node: ast.AST) -> bool:
    """The expression spells an infinity: `float("-inf")`, `math.inf`, `torch.inf`, `np.inf`, `inf`."""
    for leaf in ast.walk(node):
        if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str) and leaf.value.strip().lstrip("+-") in (
                "inf", "infinity"):
            return True
        if isinstance(leaf, ast.Attribute) and leaf.attr == "inf" or isinstance(leaf, ast.Name) and leaf.id == "inf":
            return True
    return False


GRAD_OFF_CALLS = ("no_grad", "inference_mode")


def grad_off_line(path: str, line: int | None) -> int | None:
    """The line that turned autograd off around `line`: the innermost `with torch.no_grad():` (or
    `inference_mode()`, `set_grad_enabled(False)`) whose body holds it, else the `@torch.no_grad()` decorator of the
    innermost function that holds it. None when neither is written there (grad mode was turned off by a caller
    elsewhere, or by a framework)."""
    tree = _tree(path)
    if tree is None or line is None:
        return None
    best: tuple[int, int] | None = None  # (span, line) of the innermost match
    for node in ast.walk(tree):
        end = getattr(node, "end_lineno", None) or getattr(node, "lineno", 0)
        if not hasattr(node, "lineno") or not node.lineno <= line <= end:
            continue
        found = None
        if isinstance(node, (ast.With, ast.AsyncWith)) and any(_turns_grad_off(i.context_expr) for i in node.items):
            if node.body and node.body[0].lineno <= line:
                found = node.lineno
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found = next((d.lineno for d in node.decorator_list if _turns_grad_off(d)), None)
        if found is not None and (best is None or end - node.lineno < best[0]):
            best = (end - node.lineno, found)
    return best[1] if best else None


def _turns_grad_off(node: ast.AST) -> bool:
    call = node.func if isinstance(node, ast.Call) else node
    name = call.attr if isinstance(call, ast.Attribute) else call.id if isinstance(call, ast.Name) else None
    if name in GRAD_OFF_CALLS:
        return True
    if name == "set_grad_enabled" and isinstance(node, ast.Call) and node.args:
        arg = node.args[0]
        return isinstance(arg, ast.Constant) and arg.value is False
    return False


def _divisor_name(node: ast.AST) -> str | None:
    """`accum_steps`, `args.grad_accum`, or the key of `cfg["grad_accum_steps"]`."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return dotted(node)


def accumulation_divisor_line(path: str, line: int | None) -> tuple[int, str] | None:
    """In the function that holds `line` (a `backward()` call), the division of the loss by a count named for
    gradient accumulation (`loss / accum_steps`, `loss /= args.gradient_accumulation_steps`), nearest before `line`:
    its line and the divisor's text. None when that function divides by nothing so named."""
    tree = _tree(path)
    if tree is None or line is None:
        return None
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.lineno <= line <= (n.end_lineno or n.lineno)]
    scope = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if scopes else tree
    found: list[tuple[int, str]] = []
    for node in _walk_scope(scope):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
            divisor = node.value
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            divisor = node.right
        else:
            continue
        text = _divisor_name(divisor)
        if text and ACCUMULATION_NAME.search(text) and node.lineno <= line:
            found.append((node.lineno, text))
    return max(found) if found else None


def unrun_call_line(path: str, line: int | None, method: str) -> int | None:
    """The one `<name>.<method>(…)` call in the file, where `<name>` (a plain name or `self.attr`) is what the
    assignment holding `line` (an object's construction) binds: for an object whose method never ran, the call
    the script wrote that never ran (behind a condition that never held, in a function never called). None when
    the construction is no plain assignment, or the file calls that method of the name on no line or on several."""
    tree = _tree(path)
    if tree is None or line is None:
        return None
    assigns = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
               and n.lineno <= line <= (n.end_lineno or n.lineno)]
    if not assigns:
        return None
    statement = min(assigns, key=lambda n: (n.end_lineno or n.lineno) - n.lineno)
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    names = [dotted(t) for t in targets if isinstance(t, (ast.Name, ast.Attribute))]
    if len(names) != 1 or not names[0]:
        return None
    name = names[0]
    calls = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == method and _matches(n.func.value, name)}
    return next(iter(calls)) if len(calls) == 1 else None

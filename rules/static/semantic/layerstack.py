"""The last layer an `nn.Sequential` holds when code builds it, not a literal argument list.

`nn.Sequential(nn.Linear(8, 3), nn.Softmax(1))` names its last layer in the call, but many models build the stack:
a list filled by a loop and unpacked (`layers.append(...)`, `layers[-1] = nn.Softmax(1)`, `nn.Sequential(*layers)`),
or an empty `nn.Sequential()` grown by `add_module` (vinhkhuc's tutorials, older torchvision-style heads). What the
model returns is what that last layer returns, so a rule asking whether a model ends in a softmax asks here.

Only the statements of the scope that builds the stack are read, in source order, and the last one that puts a layer
at the end wins: a loop body counts once, in its place (a layer appended in a loop and replaced after it is the
replacement). A stack whose end cannot be told (a list from a call, a `for` that appends different layers on
different branches) has no known last layer.
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.index import dotted


def _position(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def _last_of_list(index, name: str, at: ast.AST) -> ast.expr | None:
    """The layer a list named `name` holds last when `at` unpacks it: its literal's last element, then every
    `append`, `+= [...]`, `extend([...])` and `[-1] =` of that list in the same scope before `at`."""
    scope = index.scope_of(at)
    here = _position(index.statement_of(at) or at)
    steps: list[tuple[tuple[int, int], ast.expr | None]] = []
    for stmt, value in index.defs(scope).get(name, []):
        if _position(stmt) < here:
            elts = value.elts if isinstance(value, ast.List | ast.Tuple) else None
            steps.append((_position(stmt), elts[-1] if elts else None))
    for call in index.method_calls("append") + index.method_calls("extend"):
        receiver = call.func.value  # type: ignore[attr-defined]
        if not (isinstance(receiver, ast.Name) and receiver.id == name) or not call.args \
                or index.scope_of(call) is not scope or _position(call) >= here:
            continue
        added = call.args[-1]
        if call.func.attr == "extend":  # type: ignore[attr-defined]
            added = added.elts[-1] if isinstance(added, ast.List | ast.Tuple) and added.elts else None
        steps.append((_position(call), added))
    for node in index.nodes(ast.AugAssign) + index.nodes(ast.Assign):
        if index.scope_of(node) is not scope or _position(node) >= here:
            continue
        if isinstance(node, ast.AugAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name and isinstance(node.op, ast.Add):
                value = node.value
                steps.append((_position(node), value.elts[-1] if isinstance(value, ast.List | ast.Tuple)
                              and value.elts else None))
            continue
        for target in node.targets:  # type: ignore[attr-defined]
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id == name \
                    and isinstance(target.slice, ast.UnaryOp) and isinstance(target.slice.op, ast.USub) \
                    and isinstance(target.slice.operand, ast.Constant) and target.slice.operand.value == 1:
                steps.append((_position(node), node.value))  # type: ignore[attr-defined]
    if not steps:
        return None
    return max(steps, key=lambda s: s[0])[1]


def _last_added_module(index, receiver: str, call: ast.Call) -> ast.expr | None:
    """`self.net = nn.Sequential()` then `self.net.add_module("softmax", nn.Softmax(1))`: the layer of the last
    `add_module` on that name in the file (the stack is grown where it is built, in `__init__` or beside it)."""
    found = [c for c in index.method_calls("add_module")
             if dotted(c.func.value) == receiver and len(c.args) >= 2  # type: ignore[attr-defined]
             and _position(c) > _position(call) and index.class_of(c) is index.class_of(call)]
    return max(found, key=_position).args[1] if found else None


def last_layer(index, call: ast.Call, receiver: str | None = None) -> ast.expr | None:
    """The expression of the last layer the `nn.Sequential(...)` `call` holds: its last argument, the last layer of
    a list it unpacks (`*layers`), or, for an empty one bound to `receiver` (`self.net`), the last `add_module`."""
    if call.args:
        last = call.args[-1]
        if isinstance(last, ast.Starred):
            return _last_of_list(index, last.value.id, call) if isinstance(last.value, ast.Name) else None
        return last
    if receiver is not None and not call.keywords:
        return _last_added_module(index, receiver, call)
    return None

"""Command-line options a file declares: `parser.add_argument('--step_size', type=int, default=10)`.

Training scripts pass most lengths through argparse (`StepLR(opt, step_size=args.step_size)`,
`for epoch in range(args.epochs)`), so a rule that compares two lengths needs the declared defaults.
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.semantic.subtree import subtree


def option_defaults(tree: ast.AST) -> dict[str, ast.expr]:
    """The `default=` of each option declared with `add_argument`, by its destination name.

    The destination is `dest=` when given, else the first long flag with dashes turned into
    underscores (argparse's own rule). An option declared twice with different defaults is left out:
    which one runs depends on the command line or the branch taken.
    """
    found: dict[str, ast.expr] = {}
    clashing: set[str] = set()
    for node in subtree(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        default = next((k.value for k in node.keywords if k.arg == "default"), None)
        dest = _destination(node)
        if default is None or dest is None:
            continue
        if dest in found and ast.dump(found[dest]) != ast.dump(default):
            clashing.add(dest)
        found.setdefault(dest, default)
    for dest in clashing:
        del found[dest]
    return found


def _destination(call: ast.Call) -> str | None:
    for k in call.keywords:
        if k.arg == "dest" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str):
            return k.value.value
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    long = [f for f in flags if f.startswith("--")]
    if long:
        return long[0][2:].replace("-", "_")
    if flags and not flags[0].startswith("-"):
        return flags[0]  # a positional argument: its name is its destination
    return None

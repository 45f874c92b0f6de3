"""The rule API: `@rule(code, *node_types)` and the per-file `Context` a rule reports through.

See the package docstring (`torchdoctor.rules.static`) for how to add a rule.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("error", "warning", "info")


def milder(a: str, b: str) -> str:
    """The lower of two severities."""
    return a if SEVERITIES.index(a) >= SEVERITIES.index(b) else b


@dataclass(frozen=True)
class RuleDoc:
    """A rule's documentation and metadata: data, read from the family's TOML file."""

    code: str
    name: str
    severity: str
    symptom: str
    specialist: str
    summary: str  # one line: what the rule finds
    message: str  # a format string; the rule's report() fields fill it
    fix: str  # a format string too
    why: str  # why it matters, and when it does not
    bad: str  # an example that fires
    good: str  # the same example, fixed (must not fire)
    family: str = ""  # the TOML file's stem: memory, module_design, ...
    # The level its findings get by default when the rule's record on real code is weaker than its claim
    # (bench/realcode/README.md, "Severity"); empty: `severity` itself.
    calibrated: str = ""

    @property
    def level(self) -> str:
        """The severity the rule's findings are reported at unless a project's config says otherwise."""
        return self.calibrated or self.severity


CheckFunction = Callable[[Any, "Context"], None]
Names = tuple[str, ...] | Callable[[], Iterable[str]]


@dataclass(frozen=True)
class Rule:
    doc: RuleDoc
    check: CheckFunction | None  # None for TD000, which the engine raises itself
    nodes: tuple[type[ast.AST], ...]
    # Node types the check reads with `index.nodes(...)` without being called once per node: the walk must
    # still collect them when no other enabled rule subscribes to them (`--select TD608`).
    reads: tuple[type[ast.AST], ...] = ()
    # For a check subscribed to ast.Call: the only calls it can report on or leave a fact for, by what they call
    # (`index.callee(call)`) or by method name (`x.forward(...)`). The engine then calls it on those calls alone,
    # found in the index's tables, instead of on every call of the file. Names, or a function that returns them
    # (read once, for names the vocabulary holds).
    callees: Names = ()
    methods: Names = ()
    # For a check subscribed to ast.BinOp: the only operators it reads (`ast.Div` for `a / b`). The engine hands it
    # those BinOps alone, grouped by operator once per file, instead of calling it on every arithmetic expression.
    ops: tuple[type[ast.operator], ...] = ()

    @property
    def code(self) -> str:
        return self.doc.code

    @property
    def name(self) -> str:
        return self.doc.name


# (code, node types, function, module, node types read, callees, methods, operators) in registration order;
# registry.py pairs them with docs.
REGISTERED: list[tuple[str, tuple[type[ast.AST], ...], CheckFunction, str, tuple[type[ast.AST], ...], Names, Names,
                       tuple[type[ast.operator], ...]]] = []


def rule(
    code: str, *nodes: type[ast.AST], reads: tuple[type[ast.AST], ...] = (), callees: Names = (), methods: Names = (),
    ops: tuple[type[ast.operator], ...] = (),
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check for the node types it subscribes to.

    The function is called as `check(node, ctx)` once for every node of those
    types in a file (in source order), after the file's semantic index is built.
    Subscribe to `ast.Module` for a once-per-file check. `reads` names node types
    the check takes from `ctx.index.nodes(...)` itself: a once-per-file loop over
    every `ast.Name` costs far less than a call per name. `callees` and `methods` narrow an `ast.Call`
    subscription to the calls of those qualified names or method names (see `Rule.callees`): a check that returns
    at once for any other call declares them, and is then never called for the rest. `ops` narrows an `ast.BinOp`
    subscription the same way, to the expressions of those operators (`ops=(ast.Div,)`).
    """
    if not nodes or not all(isinstance(n, type) and issubclass(n, ast.AST) for n in (*nodes, *reads)):
        raise TypeError(f"@rule({code!r}, ...) needs at least one ast node type")
    if (callees or methods) and ast.Call not in nodes:
        raise TypeError(f"@rule({code!r}, ...): callees= and methods= narrow an ast.Call subscription")
    if ops and (ast.BinOp not in nodes or not all(isinstance(o, type) and issubclass(o, ast.operator) for o in ops)):
        raise TypeError(f"@rule({code!r}, ...): ops= narrows an ast.BinOp subscription to ast.operator types")

    def register(fn: CheckFunction) -> CheckFunction:
        REGISTERED.append((code, tuple(nodes), fn, fn.__module__, tuple(reads),
                           callees if callable(callees) else tuple(callees),
                           methods if callable(methods) else tuple(methods), tuple(ops)))
        return fn

    return register


# Rules that need other files of the project: `@project(code)` registers `fn(project) -> list[ProjectHit]`,
# called once after every file was analysed, over the facts each file left with `ctx.leave(key, value)`.
PROJECT_RULES: list[tuple[str, Callable[[Any], list[Any]]]] = []


def project(code: str) -> Callable[[Callable[[Any], list[Any]]], Callable[[Any], list[Any]]]:
    """Register a project pass for rule `code` (rules/static/project.py runs it)."""

    def register(fn: Callable[[Any], list[Any]]) -> Callable[[Any], list[Any]]:
        PROJECT_RULES.append((code, fn))
        return fn

    return register


@dataclass
class Hit:
    """One report() call: the rule, where, and the values that fill its message."""

    rule: Rule
    node: ast.AST
    values: dict[str, object] = field(default_factory=dict)
    severity: str | None = None  # lower than the rule's own for a milder shape of its problem; None: the rule's


class Context:
    """What a check sees of one file: its path, source, tree and semantic index.

    `ctx.index` answers questions about the script (see index.py);
    `ctx.report(node, **values)` records a finding at `node` with the values
    that fill the rule's message and fix (e.g. `variable="total_loss"`).
    """

    def __init__(self, path: str, source: str, tree: ast.Module, index, torch_version: tuple[int, int] | None):
        self.path = path
        self.source = source
        self.tree = tree
        self.index = index
        self.torch_version = torch_version
        self.rule: Rule | None = None  # set by the engine before each check runs
        self.hits: list[Hit] = []
        self.facts: dict[str, list[Any]] = {}  # what this file tells the project pass (small, JSON-able)
        self._lines: list[str] | None = None
        self._memo: dict[Any, Any] = {}

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = split_lines(self.source)
        return self._lines

    def segment(self, node: ast.AST, limit: int = 80) -> str:
        """The source text of a node on one line, clipped: for messages.

        Cut from the already split `lines` (ast.get_source_segment would
        re-split the whole file on every call); columns are UTF-8 byte offsets.
        """
        first, last = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        start, end = getattr(node, "col_offset", None), getattr(node, "end_col_offset", None)
        if first is None or last is None or start is None or end is None or last > len(self.lines):
            return ""
        if first == last:
            text = self.lines[first - 1].encode()[start:end].decode("utf-8", "replace")
        else:
            head = self.lines[first - 1].encode()[start:].decode("utf-8", "replace")
            tail = self.lines[last - 1].encode()[:end].decode("utf-8", "replace")
            text = " ".join([head, *self.lines[first : last - 1], tail])
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def memo(self, key: Any, factory: Callable[[], Any]) -> Any:
        """A per-file cache shared by all rules (e.g. a set of names several checks need)."""
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = factory()
            return value

    def torch_at_least(self, major: int, minor: int) -> bool:
        """Whether the targeted torch is at least major.minor (unknown counts as current)."""
        return self.torch_version is None or self.torch_version >= (major, minor)

    def leave(self, key: str, value: Any) -> None:
        """A fact for the project pass (`@project` rules): a class defined here, a call to another file."""
        self.facts.setdefault(key, []).append(value)

    def report(self, node: ast.AST, *, severity: str | None = None, **values: object) -> None:
        """Record a finding at `node`. `severity` lowers it below the rule's own, for a shape of the problem that
        matters less often (TD507's running totals: a sync that only costs time when steps are short)."""
        assert self.rule is not None
        if severity is not None and (severity not in SEVERITIES
                                     or SEVERITIES.index(severity) < SEVERITIES.index(self.rule.doc.severity)):
            raise ValueError(f"{self.rule.doc.code}: a finding may lower its severity, not raise it: {severity!r}")
        # JSON scalars and lists of names travel as they are (specialists test `is True`, compare numbers,
        # list names); the rest as text. Every key is declared in rules/data/evidence.toml.
        kept = {k: v if isinstance(v, (str, bool, int, float)) or _names(v) else str(v) for k, v in values.items()}
        self.hits.append(Hit(self.rule, node, kept, severity))


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def split_lines(text: str) -> list[str]:
    """Lines as the Python tokenizer counts them (\\n, \\r\\n and \\r end a line; \\f does not)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")

"""Guards: code that runs on the main process only (rank tests, decorators, early returns, callers)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import (
    FUNCTIONS,
    dotted,
    is_constant,
    last_name,
)

if TYPE_CHECKING:
    pass


def _is_single_process_test(test: ast.AST) -> bool:
    """`not dist.is_initialized()`, `not ddp`, `world_size == 1`: true when not distributed."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and last_name(test.left) in ("world_size", "WORLD_SIZE"):
        return isinstance(test.ops[0], ast.Eq | ast.LtE) and is_constant(test.comparators[0], 1)
    return False

def _body_holding(parent: ast.AST, stmt: ast.stmt) -> list[ast.stmt] | None:
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and stmt in block:
            return block
    return None

class Guards:
    """Rank-zero tests and the code they guard."""

    # Set by `global_rank_only()`: local-rank tests (`local_rank == 0`, `is_local_main_process`) stop counting
    # as rank-zero tests, because they are true on the first process of every node, not on one process.
    _global_only: bool = False

    @contextmanager
    def global_rank_only(self) -> Iterator[None]:
        """Within this block, only tests of the global rank guard code: TD303 asks whether a save that a
        local-rank test guards still runs once per node."""
        before = self._global_only
        self._global_only = True
        try:
            yield
        finally:
            self._global_only = before

    @contextmanager
    def _any_rank(self) -> Iterator[None]:
        before = self._global_only
        self._global_only = False
        try:
            yield
        finally:
            self._global_only = before

    def _local_only(self, expr: ast.AST) -> bool:
        """A local rank: `args.local_rank`, `os.environ["LOCAL_RANK"]`, `get_local_rank()`, or a name assigned only
        such values (`self.gpu_id = int(os.environ["LOCAL_RANK"])`). What a name holds decides over what it is
        called: nnU-Net's `self.local_rank = 0 if not self.is_ddp else dist.get_rank()` is the global rank, and
        so is a name the file hands to `init_process_group(rank=...)`."""
        return self._locality(expr, 0) == "local"

    def _locality(self, expr: ast.AST, depth: int) -> str | None:
        """"local", "global" or None (a constant, or nothing known) for a rank expression."""
        if isinstance(expr, ast.Call):
            if isinstance(expr.func, ast.Name) and expr.func.id == "int" and expr.args:
                return self._locality(expr.args[0], depth)
            if last_name(expr.func) == "get" and expr.args:  # os.environ.get("LOCAL_RANK", 0)
                return self._locality(expr.args[0], depth)
            if last_name(expr.func) == "get_local_rank":
                return "local"
            return "global" if last_name(expr.func) in ("get_rank", "get_global_rank") else None
        if isinstance(expr, ast.Subscript):
            return self._locality(expr.slice, depth)
        if isinstance(expr, ast.IfExp):
            kinds = {self._locality(expr.body, depth), self._locality(expr.orelse, depth)} - {None}
            return kinds.pop() if len(kinds) == 1 else ("global" if kinds else None)
        if isinstance(expr, ast.Constant):
            if isinstance(expr.value, str):
                return "local" if expr.value in self.vocab["rank"]["local_rank_names"] else "global"
            return None
        name = dotted(expr)
        if name is None:
            return None
        if name in self._rank_aliases():
            return "global"
        values = self._flag_values().get(name, []) if depth < 3 else []
        kinds = {self._locality(v, depth + 1) for v in values} - {None}
        if kinds:
            return "local" if kinds == {"local"} else "global"
        return "local" if (last_name(expr) or "").lstrip("_") in self.vocab["rank"]["local_rank_names"] else None

    def _rank_expr(self, expr: ast.AST) -> bool:
        """`rank`, `args.local_rank`, `dist.get_rank()`, `int(os.environ["RANK"])`, ..."""
        names = self.vocab["rank"]["rank_names"]
        if self._global_only and self._local_only(expr):
            return False
        if isinstance(expr, ast.Call):
            if last_name(expr.func) in ("get_rank", "get_global_rank", "get_local_rank"):
                return True
            if isinstance(expr.func, ast.Name) and expr.func.id == "int" and expr.args:
                return self._rank_expr(expr.args[0])
            if last_name(expr.func) == "get" and expr.args:  # os.environ.get("RANK", 0)
                return self._rank_expr(expr.args[0])
            return False
        if isinstance(expr, ast.Subscript):
            return self._rank_expr(expr.slice)
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value in names
        # `cfg.environment._local_rank` (H2O LLM Studio): a private attribute is still the rank
        return (last_name(expr) or "").lstrip("_") in names or (dotted(expr) or "") in self._rank_aliases()

    def _rank_aliases(self) -> set[str]:
        """Names the file hands to `init_process_group(rank=...)`, and what is assigned from them: fastMRI's
        `def main_worker(gpu, ...): args.gpu = gpu; init_process_group(..., rank=gpu)` makes `args.gpu == 0`
        the rank-zero test, whatever the name says."""
        if self._aliases is None:
            aliases: set[str] = set()
            # A call whose last name is `init_process_group` spells it in the text: most files do not, and skip the
            # loop over their every call. (The parser normalises identifiers, NFKC, so only an ASCII text is sure
            # to hold the name as the tree reads it.)
            spelled = not self.source.isascii() or "init_process_group" in self.source
            for call in self.nodes(ast.Call) if spelled else ():
                if last_name(call.func) != "init_process_group":  # type: ignore[attr-defined]
                    continue
                for kw in call.keywords:  # type: ignore[attr-defined]
                    name = dotted(kw.value) if kw.arg == "rank" else None
                    if name is not None:
                        aliases.add(name)
            for stmt in self.nodes(ast.Assign) if aliases else ():  # copies of a name handed in, if any
                value = dotted(stmt.value)  # type: ignore[attr-defined]
                if value is not None and value in aliases:
                    aliases.update(n for n in map(dotted, stmt.targets) if n is not None)  # type: ignore[attr-defined]
            self._aliases = aliases
        return self._aliases

    def is_rank_zero_test(self, test: ast.AST, _depth: int = 0) -> bool:
        """A condition true on the main process only (also a flag set from one: `args.save_logs = args.logs
        and is_master(args)`, `self.can_checkpoint = self.is_local_main if local else self.is_main`)."""
        if _depth > 4:
            return False
        if self._is_rank_zero_expr(test, _depth):
            return True
        if _depth < 2 and isinstance(test, ast.Name | ast.Attribute):
            values = self._flag_values().get(dotted(test) or "", [])
            return bool(values) and all(self.is_rank_zero_test(v, _depth + 1) for v in values)
        if isinstance(test, ast.IfExp):
            # `self.is_local_main if local_fs else self.is_main` (open_clip): one writer per node on purpose when
            # each node has its own disk, so a choice between a local and a global test counts as a guard
            with self._any_rank():
                return self.is_rank_zero_test(test.body, _depth) and self.is_rank_zero_test(test.orelse, _depth)
        return False

    def _flag_values(self) -> dict[str, list[ast.expr]]:
        """Every value assigned to a name or attribute anywhere in the file (for flags read elsewhere)."""
        if self._flags is None:
            table: dict[str, list[ast.expr]] = {}
            for stmt in self.nodes(ast.Assign):
                for target in stmt.targets:  # type: ignore[attr-defined]
                    name = dotted(target)
                    if name is not None:
                        table.setdefault(name, []).append(stmt.value)  # type: ignore[attr-defined]
            self._flags = table
        return self._flags

    def _is_rank_zero_expr(self, test: ast.AST, _depth: int = 0) -> bool:
        main = self.vocab["rank"]["main_process_names"]
        if isinstance(test, ast.BoolOp):
            if isinstance(test.op, ast.And):
                return any(self.is_rank_zero_test(v, _depth + 1) for v in test.values)
            # `not dist.is_initialized() or dist.get_rank() == 0`, `args.local_rank == -1 or dist.get_rank() == 0`
            return any(self.is_rank_zero_test(v, _depth + 1) for v in test.values) and all(
                self.is_rank_zero_test(v, _depth + 1) or _is_single_process_test(v) or self._no_rank(v)
                for v in test.values
            )
        if isinstance(test, ast.Call) and not test.args and not test.keywords and _depth < 3:
            # `if not self.is_world_master(): return` with `def is_world_master(self): return self.args.local_rank
            # == -1 or torch.distributed.get_rank() == 0` (textgen, simpletransformers): the method is the test
            target = self.local_target(test)
            returns = self.returns_of(target) if target is not None else []
            if returns and all(r is not None and self.is_rank_zero_test(r, _depth + 1) for r in returns):
                return True
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self._rank_expr(test.operand)  # `if not rank:`
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if isinstance(op, ast.Eq | ast.Is):
                return (is_constant(right, 0) and self._rank_expr(left)) or (
                    is_constant(left, 0) and self._rank_expr(right)
                )
            if isinstance(op, ast.In) and isinstance(right, ast.Tuple | ast.List | ast.Set):
                values = {e.value for e in right.elts if isinstance(e, ast.Constant)}
                return self._rank_expr(left) and values <= {0, -1} and 0 in values
            if isinstance(op, ast.Lt | ast.LtE):
                return self._rank_expr(left) and (is_constant(right, 1) if isinstance(op, ast.Lt) else is_constant(right, 0))
            return False
        if self._global_only and last_name(test) in self.vocab["rank"]["local_main_process_names"]:
            return False
        return last_name(test) in main

    def _no_rank(self, test: ast.AST) -> bool:
        """`args.local_rank == -1`: the launcher's sentinel for a run that is not distributed."""
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return False
        right = test.comparators[0]
        minus_one = isinstance(right, ast.UnaryOp) and isinstance(right.op, ast.USub) and is_constant(right.operand, 1)
        with self._any_rank():  # `local_rank == -1` says "one process" whichever rank it names
            return minus_one and self._rank_expr(test.left)

    def is_not_rank_zero_test(self, test: ast.AST) -> bool:
        """A condition true on every process except the main one (`if rank != 0: return`), also as one
        alternative of an `or` (`if not self.is_world_process_zero() or done: return`)."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
            return any(self.is_not_rank_zero_test(v) for v in test.values)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.is_rank_zero_test(test.operand)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if isinstance(op, ast.NotEq | ast.IsNot | ast.Gt):
                return (is_constant(right, 0) and self._rank_expr(left)) or (
                    is_constant(left, 0) and self._rank_expr(right)
                )
        return False

    def rank_guarded(self, node: ast.AST, _depth: int = 0) -> bool:
        """Whether `node` runs on the main process only."""
        # The call sites ask this of every call made as a statement, and the statements of one function share its
        # `if` tests, its blocks and its callers: each of those is answered once per file (and per mode, which
        # `global_rank_only` switches), not once per statement below it.
        memo = self._guard_answers
        mode = self._global_only
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, ast.If | ast.IfExp):
                in_body = child in anc.body if isinstance(anc.body, list) else child is anc.body
                in_else = child in anc.orelse if isinstance(anc.orelse, list) else child is anc.orelse
                if in_body and self._test_answer(anc.test, True, mode):
                    return True
                if in_else and self._test_answer(anc.test, False, mode):
                    return True
            if isinstance(child, ast.stmt):
                body = _body_holding(anc, child)
                if body is not None and self._early_exit_before(body, child):
                    return True
            if isinstance(anc, FUNCTIONS):
                key = ("function", anc, _depth, mode)
                found = memo.get(key)
                if found is None:
                    found = memo[key] = self._function_guarded(anc, _depth)
                return found
            child = anc
        return False

    def _test_answer(self, test: ast.AST, zero: bool, mode: bool) -> bool:
        """`is_rank_zero_test` (zero) or `is_not_rank_zero_test` of an `if` test, once per test and mode."""
        key = ("test", test, zero, mode)
        found = self._guard_answers.get(key)
        if found is None:
            found = self._guard_answers[key] = self.is_rank_zero_test(test) if zero else self.is_not_rank_zero_test(test)
        return found

    def _function_guarded(self, fn: ast.AST, depth: int) -> bool:
        """A rank-zero decorator on `fn`, or every caller of it in this file guarded (four callers up at most)."""
        decorators = self.vocab["rank"]["rank_zero_decorators"]
        if any(last_name(d) in decorators or self._rank_zero_wrapper(d) for d in fn.decorator_list):  # type: ignore[attr-defined]
            return True
        callers = self.callers(fn)
        return bool(callers) and depth < 4 and all(self.rank_guarded(c, depth + 1) for c in callers)

    def _rank_zero_wrapper(self, decorator: ast.AST) -> bool:
        """A decorator of this file whose wrapper runs the function only under a rank-zero test
        (`def main_process(func): def wrapper(*a, **k): if is_main_process(): return func(*a, **k)`)."""
        fn = self.functions.get(decorator.id) if isinstance(decorator, ast.Name) else None
        return fn is not None and any(isinstance(sub, ast.If) and self.is_rank_zero_test(sub.test) for sub in subtree(fn))

    def _early_exit_before(self, body: list[ast.stmt], stmt: ast.stmt) -> bool:
        """`if rank != 0: return` (or continue/raise/sys.exit) earlier in the same block."""
        # the block's first such exit, found once per block and mode: every statement of the block asks
        key = ("block", id(body), self._global_only)
        first = self._guard_answers.get(key, -2)
        if first == -2:
            first = self._guard_answers[key] = next(
                (i for i, s in enumerate(body) if isinstance(s, ast.If) and self.is_not_rank_zero_test(s.test)
                 and s.body and isinstance(s.body[-1], ast.Return | ast.Continue | ast.Raise)), -1)
        if first < 0:
            return False
        return not any(s is stmt for s in body[:first])

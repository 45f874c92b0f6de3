"""Call sites and the context each one runs in, for the calls another file of the project may answer.

A rule that reads one function cannot see what its callers settle: `evaluate(model, loader)` in `engine.py` runs
the model with autograd on, yet `train.py` calls it only inside `with torch.no_grad():` after `model.eval()`. Each
file describes its own calls here (`call_sites`); the project pass (rules/static/callcontext.py) joins them to the
functions they call. A site's context is a set of words:

- `no_grad`: autograd is off at the call (a `no_grad`/`inference_mode` block or decorator, `set_grad_enabled(False)`
  before it, or every caller in the file calls its function with grad off);
- `eval`: the last train/eval switch before the call, in its function, is `.eval()` on some model (`model.eval();
  validate(model, loader)`);
- `rank_zero`: the call, made as a statement, runs on the main process only (`if rank == 0:`, an early return, a
  rank-zero decorator); a call whose value is used is not asked (conservative: it keeps a finding);
- `multi_process`: the calling file runs as several processes (it sets up torch.distributed or wraps a model in
  DDP/FSDP): whatever it calls runs once per rank (timm's train.py building `ModelEma(..., resume=...)` in every
  process). Asked with `callers_any`: one such caller is enough.

Calls this file resolves itself (its own functions, `self.` methods of its classes) are left out: the rules
already follow those. A function handed to a call as a value (`register(trainer.validate)`) is a site with no context
word: whoever runs it is not known, so its callers never all agree. So are calls of libraries (torch, the standard library, the vocabulary's `external_roots`)
and the method names of tensors and modules that a project never defines for itself.
"""

from __future__ import annotations

import ast
import builtins
import sys
from typing import TYPE_CHECKING

from torchdoctor.rules.static.semantic.syntax import FUNCTIONS, is_constant, kwarg

if TYPE_CHECKING:
    pass

_BUILTINS = frozenset(dir(builtins))
_ATTRIBUTE, _NAME = ast.Attribute, ast.Name
_STDLIB = frozenset(sys.stdlib_module_names)
# What a file must mention for a call in it to run with grad off or after `.eval()` (regions.py, the framework
# hooks below); rank evidence is the vocabulary's rank names (guards.py) and `init_process_group(rank=...)`.
_EVIDENCE = {
    "no_grad": ("no_grad", "nograd", "inference_mode", "set_grad_enabled", "lightning"),
    "eval": (".eval(", ".train(", "lightning"),
}


# What a file must mention to run as several processes (semantic/contexts.py decides from the calls)
_MULTI_PROCESS = ("distributed", "DistributedDataParallel", "DDP", "FSDP", "FullyShardedDataParallel")

_RANK_NAMES: dict[int, tuple[dict[str, frozenset[str]], tuple[tuple[str, tuple[str, ...]], ...]]] = {}


def _rank_names(rank: dict[str, frozenset[str]]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The rank names a file's text is searched for, as (a part several of them share, those names), worked out once
    per vocabulary (not once per file): a text without `process` needs no search for the six names holding it, so a
    file that names no rank costs nine searches instead of seventeen."""
    cached = _RANK_NAMES.get(id(rank))
    if cached is not None and cached[0] is rank:
        return cached[1]
    names = set().union(*rank.values()) | {"init_process_group"}
    # a name that holds another is found with it: `rank` finds `local_rank`
    remaining = sorted(n for n in names if not any(m != n and m in n for m in names))
    groups: list[tuple[str, tuple[str, ...]]] = []
    while remaining:
        # the part (four characters or more) the most remaining names hold, the longest among those
        parts = sorted({n[i:j] for n in remaining for i in range(len(n)) for j in range(i + 4, len(n) + 1)})
        best = max(parts, key=lambda p: (sum(p in n for n in remaining), len(p)))
        members = tuple(n for n in remaining if best in n)
        if len(members) < 2:
            groups += [(n, (n,)) for n in remaining]
            break
        groups.append((best, members))
        remaining = [n for n in remaining if best not in n]
    # shortest part first: the common `rank` ends most searches of a file that has one
    found = tuple(sorted(groups, key=lambda g: (len(g[0]), g[0])))
    _RANK_NAMES[id(rank)] = (rank, found)
    return found


_SKIPPED: dict[int, tuple[dict, tuple[frozenset[str], frozenset[str]]]] = {}


def _skipped(skip: dict) -> tuple[frozenset[str], frozenset[str]]:
    """(the roots of calls no project file answers: the vocabulary's and the standard library's, the library
    methods), worked out once per vocabulary, not once per file: the union with the standard library's few hundred
    names was a tenth of the call sites' cost on torch's tree."""
    cached = _SKIPPED.get(id(skip))
    if cached is not None and cached[0] is skip:
        return cached[1]
    found = (frozenset(skip["external_roots"]) | _STDLIB, frozenset(skip["library_methods"]))
    _SKIPPED[id(skip)] = (skip, found)
    return found


class CallSites:
    """Each call of a function another file may define, with the context it runs in."""

    def call_sites(self) -> dict[str, list[tuple[str | None, tuple[str, ...]]]]:
        """name called -> [(qualified callee or None, the context words every such call carries)], one row per
        distinct callee, for the project pass.

        The pass asks one thing of a function's calls: do they all carry a word (callcontext.py, `callers_all`).
        So a file tells, per callee, only the words all its calls of it share, and stops asking a question of that
        callee once one call has answered no: a name called twenty times outside any `no_grad` block costs one
        `grad_disabled` walk, not twenty."""
        if self._call_sites is not None:
            return self._call_sites
        skip = self.vocab["call_sites"]
        external, methods = _skipped(skip)
        # (name, callee) -> the words every call seen so far carries; a callee whose set is empty is settled
        shared: dict[tuple[str, str | None], frozenset[str]] = {}
        # calls of one statement share its context, the one its first call here gets: (that call, words answered)
        by_statement: dict[ast.AST, tuple[ast.Call, dict[str, bool]]] = {}
        for call in self.nodes(ast.Call):
            if call.args or call.keywords:
                self._references(call, external, methods, shared)
            func = call.func
            if isinstance(func, ast.Name):
                name = func.id
                if name in _BUILTINS:
                    continue
            elif isinstance(func, ast.Attribute):
                name = func.attr
                if name.startswith("__") or name in methods:
                    continue
            else:
                continue
            if self.local_target(call) is not None:
                continue  # this file's own function: its callers are followed here
            q = self.resolve(func)
            if q is not None and q.split(".", 1)[0] in external:
                continue
            stmt = self._plain_statement(call)
            first, answers = by_statement.setdefault(stmt, (call, {})) if stmt is not None else (call, {})
            key = (name, q)
            # the words the file's text can give, searched for only once a call needs them: a third of torch's
            # files call nothing another file may define, and skip the dozens of searches of their text
            ask = shared[key] if key in shared else self._possible_words()
            if ask:
                ask = frozenset(w for w in ask if self._site_word(first, w, answers))
            shared[key] = ask
        out: dict[str, list[tuple[str | None, tuple[str, ...]]]] = {}
        for (name, q), words in shared.items():
            out.setdefault(name, []).append((q, tuple(sorted(words))))
        self._call_sites = out
        return out

    def _references(self, call: ast.Call, external: frozenset[str], methods: frozenset[str],
                    shared: dict[tuple[str, str | None], frozenset[str]]) -> None:
        """Functions handed to a call instead of called (`register_hook(trainer.validate)`, `Thread(target=evaluate)`
        with `evaluate` imported): something else runs them, in a context nobody here can read, so they are sites
        with no context word, and a function with one never has all its callers agree."""
        aliases = self.aliases
        conventional = self.vocab["conventional_aliases"]
        for arg in call.args + [k.value for k in call.keywords] if call.keywords else call.args:
            # asked of every argument of every call: the node classes compared directly (no subclasses exist)
            cls = arg.__class__
            if cls is _ATTRIBUTE:
                if arg.value.__class__ is not _NAME:
                    continue
                name = arg.attr
                if name.startswith("__") or name in methods:
                    continue
                root = arg.value.id
                if root not in aliases and root not in conventional:
                    # `self.validate`, `trainer.evaluate`: a root no import names resolves to nothing (`resolve`
                    # would say None), and most handed attributes are of locals
                    shared[(name, None)] = frozenset()
                    continue
            elif cls is _NAME and arg.id in aliases:
                name = arg.id
            else:
                continue
            q = self.resolve(arg)
            if q is not None and q.split(".", 1)[0] in external:
                continue
            shared[(name, q)] = frozenset()

    def _plain_statement(self, call: ast.Call) -> ast.AST | None:
        """The statement holding `call` when nothing between them changes the context (a conditional
        expression, a lambda, a comprehension may run apart from the rest of the statement)."""
        node: ast.AST | None = self.parent(call)
        while node is not None and not isinstance(node, ast.stmt):
            if isinstance(node, ast.IfExp | ast.Lambda | ast.BoolOp | ast.comprehension):
                return None
            node = self.parent(node)
        return node

    def _site_word(self, call: ast.Call, word: str, answers: dict[str, bool]) -> bool:
        """Whether one context word (module docstring) holds at `call`; `answers` keeps what its statement already
        answered."""
        known = answers.get(word)
        if known is not None:
            return known
        if word == "no_grad":
            found = self.grad_disabled(call)
        elif word == "eval":
            found = self.eval_switched_before(call)
        elif word == "multi_process":
            if self._multi_process is None:  # a fact of the file, asked of its every call: once
                # the router's contexts first (worked out for every file anyway), the text's evidence only then
                self._multi_process = "distributed" in self.contexts() and any(  # type: ignore[attr-defined]
                    m in self.source for m in _MULTI_PROCESS)
            found = self._multi_process
        else:
            # asked only of a call made as a statement (`trainer.end_epoch(epoch)`): writers are called for their
            # effect, and the question costs the most of the three. The text's rank names are searched for (once)
            # only when a statement call asks.
            found = isinstance(self.parent(call), ast.Expr) and self._names_rank() and self.rank_guarded(call)
        answers[word] = found
        return found

    def _possible_words(self) -> frozenset[str]:
        """The words this file's text can give at all: each question's evidence is written in the file (a grad-off
        name, a mode switch, a rank name, a Lightning import), so a file without it skips the question. The grad and
        mode evidence is searched for here; the rank and multi-process evidence, whose questions start with a
        cheaper test of their own, only when `_site_word` reaches it (rank_zero and multi_process stay possible)."""
        if self._site_words is None:
            lowered = self.lowered()  # type: ignore[attr-defined]
            found = {word for word, marks in _EVIDENCE.items() if any(m in lowered for m in marks)}
            self._site_words = frozenset(found | {"rank_zero", "multi_process"})
        return self._site_words

    def _names_rank(self) -> bool:
        """The file's text names a rank (a rank name of the vocabulary, `init_process_group`): once per file."""
        if self._rank_named is None:
            text = self.source
            self._rank_named = any(part in text and (len(held) == 1 or any(n in text for n in held))
                                   for part, held in _rank_names(self.vocab["rank"]))
        return self._rank_named

    def eval_switched_before(self, node: ast.AST, _depth: int = 0) -> bool:
        """The last `.train()`/`.eval()` switch before `node` in its function is `.eval()` (or `.train(False)`);
        when the function switches nothing, the same holds before every call of it in this file."""
        fn = self.function_of(node)
        if self._switches is None:
            table: dict[ast.AST | None, list[tuple[tuple[int, int], str]]] = {}
            for method in ("eval", "train"):
                for call in self.method_calls(method):
                    mode = _switch(call)
                    if mode is not None:
                        table.setdefault(self.function_of(call), []).append(((call.lineno, call.col_offset), mode))
            self._switches = {k: sorted(v) for k, v in table.items()}
        here = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        before = [mode for position, mode in self._switches.get(fn, ()) if position < here]
        last = before[-1] if before else None
        if last is not None:
            return last == "eval"
        if fn is not None and "eval" in self.framework_context(fn):
            return True
        if fn is None or _depth >= 3:
            return False
        callers = self.callers(fn)
        return bool(callers) and all(self.eval_switched_before(c, _depth + 1) for c in callers)

    def framework_context(self, fn: ast.AST) -> tuple[str, ...]:
        """The context a training framework calls a method in: Lightning runs the evaluation and prediction hooks
        of a LightningModule or Callback (`validation_step`, `on_validation_epoch_end`, `test_step`, ...) inside
        its evaluation loop, under `torch.no_grad`/`inference_mode` and after `model.eval()` (lightning/pytorch/
        loops/evaluation_loop.py: `run` is wrapped in `_no_grad_context`, `on_run_start` calls
        `_on_evaluation_model_eval`)."""
        name = getattr(fn, "name", None)
        if name not in self.vocab["call_sites"]["lightning_evaluation_hooks"]:
            return ()
        owner = self.parent(fn)
        if not isinstance(owner, ast.ClassDef) or not self._lightning_class(owner.name, 0):
            return ()
        return ("no_grad", "eval")

    def event_handler_point(self, fn: ast.AST) -> str | None:
        """The Ignite event a function is registered for: `@trainer.on(Events.EPOCH_STARTED)` (also
        `Events.EPOCH_STARTED(every=2)`) above it, or `trainer.add_event_handler(Events.EPOCH_STARTED, fn)` in the
        same scope; "Events.EPOCH_STARTED", or None. reid-strong-baseline steps its scheduler in such a handler."""
        def event(expr: ast.AST | None) -> str | None:
            if isinstance(expr, ast.Call):
                expr = expr.func  # `Events.ITERATION_COMPLETED(every=10)`
            name = self.resolve(expr) if isinstance(expr, ast.Attribute) else None
            if name is None or not name.rsplit(".", 2)[-2:][0] == "Events":
                return None
            return "Events." + name.rsplit(".", 1)[-1]

        for dec in getattr(fn, "decorator_list", []):
            if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "on" and dec.args:
                found = event(dec.args[0])
                if found is not None:
                    return found
        name = getattr(fn, "name", None)
        for call in self.method_calls("add_event_handler"):
            if len(call.args) >= 2 and isinstance(call.args[1], ast.Name) and call.args[1].id == name \
                    and self.function_of(call) is self.function_of(fn):
                found = event(call.args[0])
                if found is not None:
                    return found
        return None

    def _lightning_class(self, name: str, depth: int) -> bool:
        """A class of this file that derives from LightningModule or a Lightning Callback, directly or through
        bases defined in the file."""
        info = self.classes.get(name)
        if info is None or depth > 4:
            return False
        bases = self.vocab["call_sites"]["lightning_bases"]
        return any(b in bases or self._lightning_class(b, depth + 1) for b in info.bases)


def _switch(call: ast.Call) -> str | None:
    """"eval" for `m.eval()` / `m.train(False)`, "train" for `m.train()` / `m.train(True)`, None otherwise."""
    attr = call.func.attr  # type: ignore[attr-defined]
    if attr == "eval":
        return "eval" if not call.args and not call.keywords else None
    mode = kwarg(call, "mode", 0)
    if mode is None or is_constant(mode, True):
        return "train"
    return "eval" if is_constant(mode, False) else None


def function_identity(index, fn: ast.AST) -> tuple[str | None, str]:
    """(enclosing class name or None, function name): how the project pass names a function of this file."""
    owner = index.parent(fn)
    cls = owner.name if isinstance(owner, ast.ClassDef) else None
    return cls, fn.name  # type: ignore[attr-defined]


def outermost_uncalled(index, node: ast.AST, depth: int = 4) -> ast.AST | None:
    """The function holding `node` that nothing in this file calls, following single chains of local callers
    (`validate` called only by `run_eval`, which nothing here calls: `run_eval`); None when the chain reaches a
    function this file calls from several places, from module level, or not at all (the file settles it)."""
    fn = index.function_of(node)
    seen = 0
    while fn is not None and seen < depth:
        callers = index.callers(fn)
        if not callers:
            return fn if isinstance(fn, FUNCTIONS) and fn.name not in ("main", "__init__", "<module>") else None
        outer = {index.function_of(c) for c in callers}
        if len(outer) != 1 or None in outer:
            return None
        fn = outer.pop()
        seen += 1
    return None

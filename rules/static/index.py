"""The semantic index: what a training script is made of, built once per file.

The engine walks the tree once (engine.walk); that walk records every node's
parent and collects the node types the index and the rules asked for. The
index then answers, for every rule, the questions a grep cannot:

- names: `resolve(expr)` turns `F.cross_entropy`, `nn.Linear` or
  `ac` (from `from torch.cuda.amp import autocast as ac`) into qualified
  names (`torch.nn.functional.cross_entropy`, ...), re-exports canonicalised;
- bindings: which names hold a DataLoader (with its keyword arguments), a
  sampler, a scheduler, an optimizer, a GradScaler, an autocast context, a
  module (a model, and whether it is DDP/FSDP-wrapped or compiled) or a loss;
- loops: the batch (step) loop vs the epoch loop, training loops (they call
  `backward()` or `optimizer.step()`, directly or through a function of the
  file) vs validation loops;
- classes: `nn.Module` subclasses (through aliases and bases defined in the
  same file) with their `__init__`/`forward` and `self.x = ...` assignments;
  `torch.autograd.Function` subclasses;
- regions: grad disabled (`torch.no_grad()`, `inference_mode()`, decorators,
  callers), autocast (with its dtype), rank guards (`if rank == 0`,
  `is_main_process()`, `accelerator.is_main_process`, early returns, ...);
- contexts for the router: distributed, amp, compile, gpu, custom-autograd.

Names are file-global (a script rarely reuses `loader` for two kinds of
object); `self.x` attributes are keyed as "self.x".

The model is split by question, one module each under rules/static/semantic/
(the way ruff splits its semantic model): tree (where a node sits), names
(imports and calls), bindings (what a name holds), classes, flow (definitions
and callers), loops (and their roles), regions (grad mode, autocast), guards
(rank-zero code), phases (a name whose run-time value picks training or evaluation work, and what each
value runs), contexts (facts for the router), frameworks (what Accelerate's and Fabric's
runner methods do) and callsites (the context
each call of another file's function runs in). `Index` composes them;
rules ask it questions and never walk shapes themselves.
"""

from __future__ import annotations

import ast

from torchdoctor.rules.static.semantic.bindings import Binding, Bindings, looks_like_loader, looks_like_model
from torchdoctor.rules.static.semantic.callsites import CallSites
from torchdoctor.rules.static.semantic.classes import Classes, ClassInfo, SelfAssign
from torchdoctor.rules.static.semantic.contexts import Contexts
from torchdoctor.rules.static.semantic.flow import Flow
from torchdoctor.rules.static.semantic.frameworks import Frameworks
from torchdoctor.rules.static.semantic.guards import Guards
from torchdoctor.rules.static.semantic.loops import Loop, Loops, is_eval_word
from torchdoctor.rules.static.semantic.names import Names
from torchdoctor.rules.static.semantic.phases import Phase, Phases
from torchdoctor.rules.static.semantic.projectclasses import ProjectClasses
from torchdoctor.rules.static.semantic.regions import AutocastRegion, Regions
from torchdoctor.rules.static.semantic.syntax import (
    FUNCTIONS,
    LOOPS,
    SCOPES,
    WITHS,
    dotted,
    is_constant,
    kwarg,
    last_name,
)
from torchdoctor.rules.static.semantic.tree import Tree
from torchdoctor.rules.static.semantic.vocabulary import canonical, vocabulary

__all__ = [
    "FUNCTIONS", "INDEX_NODES", "LOOPS", "SCOPES", "WITHS", "AutocastRegion", "Binding", "ClassInfo", "Index",
    "Loop", "Phase", "SelfAssign", "canonical", "dotted", "is_constant", "is_eval_word", "kwarg", "last_name",
    "looks_like_loader", "looks_like_model", "vocabulary",
]

# The node types the index itself needs from the walk.
INDEX_NODES: tuple[type[ast.AST], ...] = (
    ast.Import,
    ast.ImportFrom,
    ast.Assign,
    ast.AnnAssign,
    ast.ClassDef,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.Call,
    ast.Return,
)


class Index(Tree, Names, Bindings, Classes, Flow, Loops, Phases, Regions, Guards, Contexts, CallSites, Frameworks):
    """The semantic model of one file: every question a rule may ask, answered from one walk."""

    def __init__(
        self,
        tree: ast.Module,
        buckets: dict[type, list[ast.AST]],
        parents: dict[ast.AST, ast.AST],
        source: str = "",
        project: ProjectClasses | None = None,
        module: str | None = None,
    ):
        self.tree = tree
        self.project = project  # the project's module classes, from the pre-pass (projectclasses.py)
        self.module = module  # this file's dotted module name in the project, for the pre-pass's tables
        self.buckets = buckets
        self.parents = parents
        self.source = source
        self.vocab = vocabulary()
        self.names = self.vocab["names"]
        self.aliases: dict[str, str] = {}
        self.star_imports: list[str] = []
        self.imported: set[str] = set()  # qualified module/object names imported
        self.bindings: dict[str, list[Binding]] = {}
        self._flags: dict[str, list[ast.expr]] | None = None  # name -> values assigned anywhere (guards.py)
        self._aliases: set[str] | None = None  # names handed to init_process_group(rank=...) (guards.py)
        self._guard_answers: dict = {}  # rank tests, blocks and functions already answered (guards.py)
        self._grad_answers: dict = {}  # `with` blocks, functions and their callers already answered (regions.py)
        self._entries: dict[str, set[str]] = {}  # container name -> keys bound in it ("['train']")
        self.classes: dict[str, ClassInfo] = {}
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}  # module-level functions
        self.loops: dict[ast.AST, Loop] = {}
        self.calls_by_name: dict[str, list[ast.Call]] = {}
        self.calls_by_method: dict[str, list[ast.Call]] = {}
        self._callee: dict[ast.Call, str | None] = {}
        self._call_order: dict[ast.Call, int] | None = None  # call -> its place in the walk (names.py)
        self._resolved: dict[ast.AST | None, str | None] = {}  # names.py
        self._scope: dict[ast.AST, ast.AST] = {}
        self._binops: dict[type, list[ast.AST]] | None = None  # operator -> the file's BinOps of it (tree.py)
        self._used_prefixes: tuple[frozenset[str], list[str]] | None = None  # names imported or called (names.py)
        self._loop_of: dict[ast.AST, Loop | None] = {}
        self._assigned: dict[ast.AST, frozenset[str]] = {}  # names a loop rebinds (loops.py)
        self._local_target_map: dict[ast.Call, ast.AST] | None = None  # call -> local function it calls
        self._calls_by_fn: dict[ast.AST | None, list[ast.Call]] | None = None  # function -> its own calls
        self._defs: dict[ast.AST, dict[str, list[tuple[ast.stmt, ast.expr]]]] | None = None
        self._self_assigns: dict[ast.ClassDef, list[SelfAssign]] | None = None
        self._callers: dict[ast.AST, list[ast.Call]] | None = None
        self._call_sites: dict[str, list[tuple[str | None, tuple[str, ...]]]] | None = None  # callsites.py
        self._site_words: frozenset[str] | None = None  # callsites.py
        self._multi_process: bool | None = None  # callsites.py
        self._rank_named: bool | None = None  # callsites.py
        self._runner_names: dict[str, str] | None = None  # frameworks.py
        self._prepared_names: dict[str, list[ast.Call]] | None = None  # bindings.py: `x = accelerator.prepare(...)`
        self._switches: dict[ast.AST | None, list[tuple[tuple[int, int], str]]] | None = None  # callsites.py
        self._local_calls: list[tuple[ast.Call, ast.AST]] | None = None
        self._runner_names: dict[str, str] | None = None  # frameworks.py
        self.training_functions: set[ast.AST] = set()
        self.backward_calls: list[ast.Call] = []
        self.step_calls: list[ast.Call] = []
        self._returns_of: dict[ast.AST | None, list[ast.expr]] = {}  # a function's return values (bindings.py)
        self._samplers_in_text: bool | None = None  # bindings.py
        self._assigned_names: frozenset[str] | None = None  # flow.py
        self._values: dict[str, list[ast.expr]] | None = None  # flow.py
        self._in_order: list[ast.stmt] | None = None  # the file's assignments in source order (flow.py)
        self._contexts: frozenset[str] | None = None  # contexts.py
        self._lowered: str | None = None  # the source in lower case (`lowered`)
        self._build()

    def lowered(self) -> str:
        """The file's text in lower case, made once per file: the call sites' evidence and the resume words are
        both searched for in it, and lowering a whole text costs as much as several searches of it."""
        if self._lowered is None:
            self._lowered = self.source.lower()
        return self._lowered

    def _build(self) -> None:
        # The order matters: names first (calls resolve through aliases), classes before bindings (a local
        # nn.Module class makes a module binding), bindings before training (kinds tell optimizer steps),
        # training before loops (a loop's role depends on what trains).
        self._build_names()
        self._build_classes()
        self._index_calls()
        self._build_bindings()
        self._bind_parameters()
        self._late_copies()
        self._bind_from_use()
        self._build_training()
        self._build_loops()

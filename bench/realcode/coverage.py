"""How much of real training code the semantic model resolves: coverage on healthy code, without labels.

    python bench/realcode/coverage.py [--split dev|heldout] [--summary] [--repo PATTERN] [--json]

Recall on labelled bugs moves one bug at a time; what reaches code nobody labelled is whether the index knows
the objects a training loop works with. This script finds every training step loop of the corpus and asks the
index (the `Index` the rules use, built the way `check` builds it) what it knows about that loop:

- trains     the index sees the loop as a training loop (`Loop.trains`)
- role       the index gives it a role (`Loop.kind` is batch or epoch)
- optimizer  an optimizer step the loop runs has a receiver bound to an optimizer (or `scaler.step(opt)` with one)
- model      a call the loop runs is a call of a name bound to a module; `model_class`: that binding's class known
- loader     the loop over the data (the loop with the backward or step in its own body, over anything but
             `range`/`count`) iterates a name bound to a DataLoader
- loss       the value a backward runs on holds the graph by the index's reading (`patterns.holds_graph`)
- scheduler  (loops that step something named or bound as a scheduler) the receiver is bound to one
- *_named    the same question answered the way the rules answer it, a name counting as evidence
             (`is_model`, `Loop.iterates_loader`): what a rule sees, not what is known

The loops are found without the index, so its misses count: a loop whose body, directly or through a function or
method defined anywhere in the project (matched by name), calls `.backward()` (or `manual_backward`,
`torch.autograd.backward`) or `.step()` on a receiver named like an optimizer or scaler. The calls a loop runs
are its own plus those of the project functions it calls, three calls deep; each call is asked of the index of
its own file. Framework entry points (Lightning `training_step`, Hugging Face `compute_loss`, Accelerate's
`accelerator.backward`) are counted apart: their loop lives in the framework.

Corpus, mirrors and cache are eval_check.py's (`--mirror`, `--cache`). Use `--summary` for heldout: fractions
only, never its unresolved examples (reading them would tune on heldout). Exit 0 (a report), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import tarfile
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from eval_check import HERE, Project, extract, fail, has_commit, mirror_dir, read_jsonl, wanted_repo

from torchdoctor.rules.static.semantic.syntax import dotted as _dotted
from torchdoctor.rules.static.semantic.syntax import last_name, own_nodes

# No `optimizer_named`: the loops are found by steps on receivers named like optimizers, so it would always hold.
QUESTIONS = ("trains", "role", "optimizer", "model", "model_class", "model_named", "loader", "loader_named", "loss",
             "scheduler")
CALL_DEPTH = 3
# `.step()` receivers that are an optimizer or a GradScaler by their name, for finding loops without the index.
_STEPPER = re.compile(r"optim|(?:^|_)opt(?:_|$|s$)|scaler|(?:^|_)(?:sgd|adam|adamw)(?:_|$)", re.I)
_SCHEDULER = re.compile(r"sched|(?:^|_)lr(?:_|$)|warmup", re.I)
# Names too common to follow by name across files: a method called `step` or `forward` is anyone's.
_NOT_FOLLOWED = frozenset({"step", "forward", "__call__", "backward", "__init__", "train", "eval", "update", "run"})
_COUNTERS = frozenset({"range", "count", "itertools.count", "trange"})


@dataclass
class FileModel:
    display: str
    index: Any  # the file's semantic Index


@dataclass
class LoopReport:
    where: str  # path:line
    answers: dict[str, bool | None] = field(default_factory=dict)  # None: the question does not apply
    kind: str = "other"


def _receiver_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        value = func.value
        while isinstance(value, ast.Call | ast.Subscript):  # `scaler.scale(loss).backward()`, `opts[0].step()`
            value = value.func if isinstance(value, ast.Call) else value.value
            if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name | ast.Attribute):
                value = value.value
        return _dotted(value) or ""
    return ""




def is_backward(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("backward", "manual_backward"):
        return not call.args or func.attr == "manual_backward" or _dotted(func.value) in ("accelerator", "self.accelerator", "fabric", "self.fabric")  # noqa: E501
    return _dotted(func) in ("torch.autograd.backward", "autograd.backward")


def is_step(call: ast.Call) -> bool:
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "step"):
        return False
    last = _receiver_name(call).rsplit(".", 1)[-1]
    return bool(_STEPPER.search(last)) and not _SCHEDULER.search(last)


def is_scheduler_step(call: ast.Call, index: Any) -> bool:
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "step"):
        return False
    b = index.binding(func.value)
    if b is not None:
        return b.kind == "scheduler"
    return bool(_SCHEDULER.search(_receiver_name(call).rsplit(".", 1)[-1]))


def _own_calls(fn: ast.AST) -> list[ast.Call]:
    """Calls in a function's (or loop's) body, not in functions or classes nested in it."""
    return [node for node in own_nodes(fn) if isinstance(node, ast.Call)]


class ProjectModel:
    """Every file's Index, and the project's functions by name (for following calls across files)."""

    def __init__(self, files: list[FileModel]):
        self.files = files
        self.functions: dict[str, list[tuple[FileModel, ast.AST]]] = {}
        for f in files:
            for kind in (ast.FunctionDef, ast.AsyncFunctionDef):
                for fn in f.index.nodes(kind):
                    self.functions.setdefault(fn.name, []).append((f, fn))
        self._calls: dict[int, list[ast.Call]] = {}
        self.training = self._training_functions()

    def calls_of(self, node: ast.AST) -> list[ast.Call]:
        found = self._calls.get(id(node))
        if found is None:
            found = self._calls[id(node)] = _own_calls(node)
        return found

    def _training_functions(self) -> set[int]:
        trains: set[int] = set()
        every = [(f, fn) for pairs in self.functions.values() for f, fn in pairs]
        for _f, fn in every:
            if any(is_backward(c) or is_step(c) for c in self.calls_of(fn)):
                trains.add(id(fn))
        for _ in range(4):
            names = {fn.name for _f, fn in every if id(fn) in trains} - _NOT_FOLLOWED
            grown = False
            for _f, fn in every:
                if id(fn) not in trains and any(last_name(c) in names for c in self.calls_of(fn)):
                    trains.add(id(fn))
                    grown = True
            if not grown:
                break
        return trains

    def targets(self, f: FileModel, call: ast.Call) -> list[tuple[FileModel, ast.AST]]:
        """The project functions a call may run: the index's own answer first, else by name (not common names)."""
        local = f.index.local_target(call)
        if local is not None:
            return [(f, local)]
        name = last_name(call)
        if name is None or name in _NOT_FOLLOWED:
            return []
        return self.functions.get(name, [])[:3]

    def region(self, f: FileModel, loop: ast.AST) -> list[tuple[FileModel, ast.Call]]:
        """(file, call) for the calls a loop runs: its own and those of project functions it calls."""
        out: list[tuple[FileModel, ast.Call]] = []
        seen: set[int] = set()
        frontier = [(f, c) for c in _loop_calls(loop)]
        for depth in range(CALL_DEPTH + 1):
            nxt: list[tuple[FileModel, ast.Call]] = []
            for owner, call in frontier:
                if id(call) in seen:
                    continue
                seen.add(id(call))
                out.append((owner, call))
                if depth < CALL_DEPTH:
                    for g, fn in self.targets(owner, call):
                        nxt += [(g, c) for c in self.calls_of(fn)]
            frontier = nxt
        return out

    def loop_trains(self, f: FileModel, loop: ast.AST) -> bool:
        for call in _loop_calls(loop):
            if is_backward(call) or is_step(call):
                return True
            name = last_name(call)
            if any(id(fn) in self.training for _g, fn in self.targets(f, call)) and name not in _NOT_FOLLOWED:
                return True
        return False


def _loop_calls(loop: ast.AST) -> list[ast.Call]:
    """Calls in a loop's body and else (its own, also in nested loops; not in nested functions)."""
    out: list[ast.Call] = []
    for stmt in [*loop.body, *loop.orelse]:  # type: ignore[attr-defined]
        if isinstance(stmt, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Return):
            out += [n for n in ast.walk(stmt) if isinstance(n, ast.Call)]
        elif not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out += _own_calls(stmt) if not isinstance(stmt, ast.Call) else [stmt]
    return out


def _direct(loop: ast.AST) -> bool:
    """A backward or optimizer step in the loop's own body (not only in a nested loop)."""
    stack = [*loop.body, *loop.orelse]  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.For | ast.AsyncFor | ast.While | ast.FunctionDef | ast.AsyncFunctionDef
                      | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.Call) and (is_backward(node) or is_step(node)):
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _model_answer(region: list[tuple[FileModel, ast.Call]]) -> tuple[bool, bool]:
    kind = known = False
    for f, call in region:
        func = call.func
        if not isinstance(func, ast.Name | ast.Attribute | ast.Subscript):
            continue
        b = f.index.binding(func)
        if b is None or b.kind != "module":
            continue
        kind = True
        if b.cls or (b.inner and (inner := f.index.binding(b.inner)) is not None and inner.cls):
            known = True
            break
    return kind, known


def _optimizer_answer(region: list[tuple[FileModel, ast.Call]]) -> bool | None:
    asked = False
    for f, call in region:
        if not is_step(call) and not (isinstance(call.func, ast.Attribute) and call.func.attr == "step"
                                      and f.index.is_optimizer_step(call)):
            continue
        asked = True
        receiver = call.func.value  # type: ignore[attr-defined]
        b = f.index.binding(receiver)
        if b is not None and b.kind == "optimizer":
            return True
        if b is not None and b.kind == "scaler" and call.args:
            inner = f.index.binding(call.args[0])
            if inner is not None and inner.kind == "optimizer":
                return True
    return False if asked else None


def _loss_answer(region: list[tuple[FileModel, ast.Call]]) -> bool | None:
    from torchdoctor.rules.static.patterns import holds_graph

    asked = False
    for f, call in region:
        if not is_backward(call):
            continue
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "backward" and not call.args:
            value = func.value
            # `scaler.scale(loss).backward()`: the loss is the argument of scale
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "scale" \
                    and value.args:
                value = value.args[0]
        else:
            value = call.args[0] if call.args else None
        if value is None:
            continue
        asked = True
        try:
            if holds_graph(f.index, value, call, set()):
                return True
        except RecursionError:
            pass
    return False if asked else None


def _scheduler_answer(region: list[tuple[FileModel, ast.Call]]) -> bool | None:
    asked = False
    for f, call in region:
        if not is_scheduler_step(call, f.index):
            continue
        asked = True
        b = f.index.binding(call.func.value)  # type: ignore[attr-defined]
        if b is not None and b.kind == "scheduler":
            return True
    return False if asked else None


def _loader_answer(node: ast.AST, loop: Any, innermost: bool) -> bool | None:
    """Asked of the loop that draws the batches: the backward or step in its own body, or no training loop inside it."""
    if not isinstance(node, ast.For | ast.AsyncFor) or not (innermost or _direct(node)):
        return None
    iterable = node.iter
    while isinstance(iterable, ast.Call) and iterable.args and (_dotted(iterable.func) or "") in (
            "enumerate", "tqdm", "tqdm.tqdm", "zip", "iter"):
        iterable = iterable.args[0]
    if isinstance(iterable, ast.Call) and (_dotted(iterable.func) or "").rsplit(".", 1)[-1] in _COUNTERS:
        return None  # a counted loop draws its batches itself (`get_batch()`, `next(it)`)
    b = loop.source_binding if loop is not None else None
    return bool(b is not None and b.kind == "dataloader")


def analyse_loops(project: ProjectModel) -> list[LoopReport]:
    reports: list[LoopReport] = []
    for f in project.files:
        index = f.index
        found = [n for n in sorted(index.loops, key=lambda n: (n.lineno, n.col_offset)) if project.loop_trains(f, n)]
        ids = {id(n) for n in found}
        for node in found:
            loop = index.loops.get(node)
            innermost = not any(id(sub) in ids for sub in own_nodes(node))
            region = project.region(f, node)
            model_kind, model_class = _model_answer(region)
            optimizer = _optimizer_answer(region)
            loader = _loader_answer(node, loop, innermost)
            answers: dict[str, bool | None] = {
                "trains": bool(loop and loop.trains),
                "role": bool(loop and loop.kind in ("batch", "epoch")),
                "optimizer": optimizer,
                "model": model_kind,
                "model_class": model_class,
                "model_named": model_kind or any(
                    isinstance(c.func, ast.Name | ast.Attribute) and f.index.is_model(c.func) for f, c in region),
                "loader": loader,
                "loader_named": None if loader is None else bool(loop and loop.iterates_loader),
                "loss": _loss_answer(region),
                "scheduler": _scheduler_answer(region),
            }
            reports.append(LoopReport(f"{f.display}:{node.lineno}", answers, loop.kind if loop else "none"))
    return reports


def entry_points(project: ProjectModel) -> Counter:
    """Framework entry points: where the framework runs the loop and the project supplies a step."""
    found: Counter = Counter()
    for f in project.files:
        index = f.index
        for fn in index.nodes(ast.FunctionDef):
            if fn.name == "training_step":
                info = index.class_of(fn.body[0]) if fn.body else None
                found["lightning training_step"] += 1
                found["lightning training_step, module class"] += bool(info and info.is_module)
            elif fn.name == "compute_loss":
                found["hf compute_loss"] += 1
        for call in index.method_calls("backward"):
            if call.args and index.framework_of(call.func.value) == "accelerate":
                found["accelerate backward"] += 1
    return found


def build_project(root: str, paths: list[str]) -> ProjectModel:
    """Each file of a project the way `check` finds it (its excludes) and indexes it (its walk, its Index)."""
    from torchdoctor.check import discover
    try:  # the pre-pass of project classes; an older torchdoctor (a baseline run) has none
        from torchdoctor.check import _roots, project_classes
    except ImportError:
        _roots = project_classes = None
    from torchdoctor.config import Settings
    from torchdoctor.rules.static import registry
    from torchdoctor.rules.static.engine import _wanted, walk
    from torchdoctor.rules.static.index import Index
    from torchdoctor.rules.static.sources import UnreadableSource, read_unit

    wanted = _wanted(list(registry.rules().values()))
    here = os.getcwd()
    os.chdir(root)
    files: list[FileModel] = []
    try:
        items = discover(paths, Settings(root=root))
        known = project_classes(items, _roots(paths), 2_000_000) if project_classes is not None else None
        for path, display in items:
            try:
                unit = read_unit(path, display, 2_000_000)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tree = ast.parse(unit.text)
                buckets, parents = walk(tree, wanted)
                # the file's module, as `check` tells it (what callers in other files hand in is kept by module);
                # an older torchdoctor's pre-pass has no such table
                module = getattr(known, "paths", {}).get(display) if known is not None else None
                if module is not None:
                    index = Index(tree, buckets, parents, unit.text, known, module)
                elif known is not None:
                    index = Index(tree, buckets, parents, unit.text, known)
                else:
                    index = Index(tree, buckets, parents, unit.text)
                files.append(FileModel(display, index))
            except (UnreadableSource, SyntaxError, ValueError, RecursionError, MemoryError):
                continue
            except Exception as exc:  # noqa: BLE001 - the index's own bug: counted, not fatal
                print(f"  index failed on {root}/{display}: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        os.chdir(here)
    return ProjectModel(files)


def summarise(reports: list[LoopReport], entries: Counter) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for q in QUESTIONS:
        asked = [r for r in reports if r.answers.get(q) is not None]
        yes = sum(1 for r in asked if r.answers[q])
        table[q] = {"resolved": yes, "asked": len(asked), "fraction": round(yes / len(asked), 3) if asked else None}
    return {"loops": len(reports), "questions": table, "kinds": dict(Counter(r.kind for r in reports)),
            "entry_points": dict(entries)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--split", choices=("dev", "heldout"), default="dev")
    ap.add_argument("--summary", action="store_true", help="fractions only, no unresolved examples (use for heldout)")
    ap.add_argument("--repo", action="append", default=[], help="only repositories whose name contains this")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--manifest", default=os.path.join(HERE, "repos.jsonl"))
    ap.add_argument("--mirror", default="/work/.mirror")
    ap.add_argument("--cache", default="/tmp/realcode-cache")
    ap.add_argument("--examples", type=int, default=40, help="unresolved examples shown per question")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.split == "heldout" and not args.summary:
        fail("heldout coverage is shown as fractions only: add --summary")
    if not os.path.isfile(args.manifest):
        fail(f"no manifest at {args.manifest}")
    reports: list[LoopReport] = []
    entries: Counter = Counter()
    skipped = 0
    for row in read_jsonl(args.manifest):
        if row.get("split") != args.split or not wanted_repo(row["repo"], args.repo):
            continue
        project = Project("healthy", row["repo"], row["commit"], list(row["paths"]), row["split"], row)
        git_dir = mirror_dir(args.mirror, project.repo)
        if not os.path.isdir(git_dir) or not has_commit(git_dir, project.commit):
            skipped += 1
            continue
        try:
            root, paths = extract(project, args.mirror, args.cache)
        except (RuntimeError, OSError, tarfile.TarError):
            skipped += 1
            continue
        model = build_project(root, paths)
        for r in analyse_loops(model):
            r.where = f"{project.repo}/{r.where}"
            reports.append(r)
        entries.update(entry_points(model))
    summary = summarise(reports, entries)
    summary["skipped_entries"] = skipped
    if args.json:
        if not args.summary:
            summary["unresolved"] = {q: [r.where for r in reports if r.answers.get(q) is False] for q in QUESTIONS}
        print(json.dumps(summary, indent=1))
        return 0
    print(f"{args.split}: {summary['loops']} training step loops ({skipped} entries skipped: not fetched)")
    for q, row in summary["questions"].items():
        frac = "-" if row["fraction"] is None else f"{row['fraction']:.2f}"
        print(f"  {q:12s} {frac:>5s}  {row['resolved']}/{row['asked']}")
    print("  loop kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["kinds"].items())))
    print("  framework entry points: " + (", ".join(f"{k} {v}" for k, v in sorted(entries.items())) or "none"))
    if not args.summary:
        for q in QUESTIONS:
            missed = [r.where for r in reports if r.answers.get(q) is False]
            if missed:
                print(f"\nunresolved {q} ({len(missed)}):")
                for where in missed[: args.examples]:
                    print(f"  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

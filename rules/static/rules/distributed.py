"""TD3xx — distributed training: samplers and their epochs, rank-0 duties, the DDP wrapper's state_dict,
gradient accumulation without no_sync, device binding for NCCL, expand() in a DDP model's forward.
Docs: distributed.toml."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from torchdoctor.rules.static.api import Context, project, rule
from torchdoctor.rules.static.callcontext import call_context, leave_sites
from torchdoctor.rules.static.index import (
    Binding,
    ClassInfo,
    Index,
    Loop,
    dotted,
    is_constant,
    is_eval_word,
    kwarg,
    last_name,
)
from torchdoctor.rules.static.project import Project, ProjectHit
from torchdoctor.rules.static.rules.mixed_precision import accumulations, number
from torchdoctor.rules.static.semantic.subtree import subtree


def _position(node: ast.AST) -> tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _binding_at(index: Index, expr: ast.AST | str | None, at: ast.AST) -> Binding | None:
    """The binding a name holds at `at`: the latest one assigned before it, else the file's last."""
    name = expr if isinstance(expr, str) else dotted(expr)
    found = index.bindings.get(name or "")
    if not found:
        return None
    before = [b for b in found if _position(b.node) < _position(at)]
    return before[-1] if before else found[-1]


def _distributed_setup(ctx: Context) -> ast.AST | None:
    """The call that makes this a multi-process script: init_process_group, DDP/FSDP, Accelerator(), DeepSpeed's
    engine or process group (`deepspeed.initialize`, `deepspeed.init_distributed`: one process per GPU, each
    running the whole script)."""

    def find() -> ast.AST | None:
        index = ctx.index
        names = sorted(
            index.names["ddp"] | index.names["fsdp"] | {"torch.distributed.init_process_group", "accelerate.Accelerator",
                                                        "deepspeed.initialize", "deepspeed.init_distributed"}
        )
        calls = index.calls_to(*names)
        return calls[0] if calls else None

    return ctx.memo("distributed-setup", find)


# -- TD301 ---------------------------------------------------------------------------------------

_SAMPLER_POSITION = 3  # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)


def _loaders_using(index: Index, sampler: str) -> list[Binding]:
    return [b for b in index.bindings_of("dataloader") if dotted(b.arg("sampler", _SAMPLER_POSITION)) == sampler]


def _loaders_reused_across_epochs(index: Index, epoch_loops: list[Loop]) -> dict[str, Loop]:
    """Loader names iterated inside an epoch loop, or passed to a call made in one, with that epoch loop."""
    found: dict[str, Loop] = {}
    loops_by_fn: dict[ast.AST | None, list[Loop]] = {}
    for lp in index.loops.values():
        loops_by_fn.setdefault(index.function_of(lp.node), []).append(lp)
    for epoch in epoch_loops:
        for child in _descendants(epoch):
            if child.source and child.iterates_loader:
                found.setdefault(child.source, epoch)
        for call in epoch.all_calls():
            # `while True: self._train_epoch()`, whose loop iterates `self.data_loader["train"]`
            target = index.local_target(call)
            for lp in loops_by_fn.get(target, []) if target is not None else []:
                if lp.source and lp.iterates_loader:
                    found.setdefault(lp.source, epoch)
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                name = dotted(arg)
                if name is not None:
                    found.setdefault(name, epoch)
    return found


def _helper_sampler(index: Index, call: ast.Call) -> bool:
    """A call of a function of this file that returns a shuffling DistributedSampler (`data_sampler(dataset,
    shuffle=True, distributed=args.distributed)`, stylegan2): the loader it feeds may get that sampler."""
    target = index.local_target(call)
    if target is None:
        return False
    dist_samplers = index.names["distributed_samplers"]
    return any(
        isinstance(value, ast.Call)
        and any(c in dist_samplers for c in index.class_choices(value.func))
        and not is_constant(kwarg(value, "shuffle", 3), False)
        for value in index.returns_of(target)
    )


def _distributed_branch(index: Index, b: Binding) -> ast.Call | None:
    """The DistributedSampler of a sampler chosen by launch mode (`RandomSampler(ds) if local_rank == -1 else
    DistributedSampler(ds)`): the binding keeps the first branch's class, but under the launcher the other one runs."""
    value = getattr(b.node, "value", None)
    if not isinstance(value, ast.IfExp) or b.call is None or b.cls in index.names["distributed_samplers"]:
        return None
    for branch in (value.body, value.orelse):
        if isinstance(branch, ast.Call) and any(c in index.names["distributed_samplers"]
                                                for c in index.class_choices(branch.func)):
            return branch
    return None


def _factory_sampler_call(b: Binding) -> ast.Call | None:
    """The call of another file's factory that returns a DistributedSampler (`sampler = build_sampler(dataset,
    world_size, rank)`, the pre-pass of projectcalls.py gives the binding its class but no constructor call): the
    place to report. None when the caller asks the factory for a fixed order (`shuffle=False`), which the factory's
    own constructor arguments, in the other file, may then follow."""
    stmt = b.node
    value = getattr(stmt, "value", None)
    if not isinstance(value, ast.Call) or any(
            k.arg and "shuffle" in k.arg and is_constant(k.value, False) for k in value.keywords):
        return None
    return value


def _cycled_loaders(index: Index) -> dict[str, Loop]:
    """Loaders handed to a generator that re-iterates its parameter without end (`def sample_data(loader):
    while True: for batch in loader: yield batch`), in a file that trains: each pass over the data is an
    epoch that the `while` starts. The loader's name at the call, with that `while` loop."""
    found: dict[str, Loop] = {}
    if not index.training_loops():
        return found
    for lp in index.loops.values():
        if not isinstance(lp.node, ast.While):
            continue
        fn = index.function_of(lp.node)
        if not isinstance(fn, ast.FunctionDef) or not any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(lp.node)):
            continue
        iterated = {c.source for c in _descendants(lp) if c.source and c.iterates_loader}
        iterated |= {n.value.id for n in ast.walk(lp.node) if isinstance(n, ast.YieldFrom) and isinstance(n.value, ast.Name)}
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        for position, param in enumerate(params):
            if param not in iterated:
                continue
            for call in index.callers(fn):
                name = dotted(kwarg(call, param, position))
                if name is not None:
                    found.setdefault(name, lp)
    return found


def _descendants(loop: Loop) -> list[Loop]:
    out: list[Loop] = []
    todo = list(loop.children)
    while todo:
        child = todo.pop()
        out.append(child)
        todo += child.children
    return out


@rule("TD301", ast.Module)
def sampler_epoch_not_set(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    dist_samplers = index.names["distributed_samplers"]
    # (how the sampler is reached, its constructor call, loaders that use it)
    candidates: list[tuple[str, ast.Call, list[Binding]]] = []
    for b in index.bindings_of("sampler"):
        chosen = _distributed_branch(index, b)
        if chosen is not None:
            candidates.append((b.name, chosen, _loaders_using(index, b.name)))
        elif b.cls in dist_samplers and b.call is not None:
            candidates.append((b.name, b.call, _loaders_using(index, b.name)))
        elif b.cls in dist_samplers and (factory := _factory_sampler_call(b)) is not None:
            # `loader, sampler = get_loaders(dataset)`: a factory that returns a loader with a sampler returns the
            # loader's own sampler, so the loaders the same statement binds are the ones over it
            loaders = _loaders_using(index, b.name) or [lb for lb in index.bindings_of("dataloader") if lb.node is b.node]
            candidates.append((b.name, factory, loaders))
    for loader in index.bindings_of("dataloader"):
        inline = loader.arg("sampler", _SAMPLER_POSITION)
        if isinstance(inline, ast.Call) and (
            any(c in dist_samplers for c in index.class_choices(inline.func)) or _helper_sampler(index, inline)
        ):
            candidates.append((f"{loader.name}.sampler", inline, [loader]))
    _leave_epoch_sources(ctx)
    if not candidates:
        return
    epoch_loops = [lp for lp in index.epoch_loops() if lp.trains]
    cycled = _cycled_loaders(index)
    if not epoch_loops and not cycled:
        _leave_samplers(ctx, candidates)  # a data module: the epoch loop may be another file's
        return  # one pass over the data here: the order never repeats
    repeated = {**cycled, **_loaders_reused_across_epochs(index, epoch_loops)}
    set_epoch = index.method_calls("set_epoch")
    if ctx.source.count("set_epoch") > len(set_epoch):
        return  # `getattr(sampler, "set_epoch")` or a similar indirect call
    targets = {dotted(c.func.value) for c in set_epoch}  # type: ignore[attr-defined]
    if None in targets:
        return  # `get_sampler().set_epoch(epoch)`: a receiver we cannot name
    # One sampler reached under several names (a loader passed on as a parameter, returned, prepared) is one
    # sampler: `set_epoch` on any of its names counts, and it gives one finding.
    by_call: dict[int, set[str]] = {}
    for name, call, loaders in candidates:
        by_call.setdefault(id(call), set()).update({name} | {f"{lb.name}.sampler" for lb in loaders})
    reach = {name: by_call[id(call)] for name, call, _ in candidates}
    known = set().union(*reach.values())
    seen_calls: set[int] = set()
    for name, call, loaders in candidates:
        if id(call) in seen_calls:
            continue
        seen_calls.add(id(call))
        if is_constant(kwarg(call, "shuffle", 3), False):
            continue  # a fixed order by design (validation shards)
        if is_eval_word(name) or (loaders and all(is_eval_word(lb.name) for lb in loaders)):
            continue
        # a loader iterated under another name after a pass-through (`distr_dl = backend.distribute(dl)`)
        same = {other: lb for lb in loaders for other in repeated
                if (b := index.binding(other)) is not None and b.call is lb.call}
        used = [lb for lb in loaders if lb.name in repeated] or list(same.values())
        if not used:
            continue  # no loader over it is iterated epoch after epoch
        if targets & reach[name] or any(t not in known for t in targets):
            continue  # set on this sampler, or on a receiver we cannot tie to another sampler
        loop_name = used[0].name if used[0].name in repeated else next(o for o, lb in same.items() if lb is used[0])
        epoch_loop = repeated[loop_name]
        values = dict(variable=name, loop=f"line {epoch_loop.line}")
        it = getattr(epoch_loop.node, "iter", None)
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and len(it.args) == 1:
            count = number(ctx, it.args[0], epoch_loop.node)
            if count is not None:
                values["epochs"] = round(count)  # the specialist quotes it
        ctx.report(call, **values)


def _leave_epoch_sources(ctx: Context) -> None:
    """For the project pass: whether this file calls set_epoch at all, and the loaders (by their last name:
    `train_loader` for `data.train_loader`) that its training epoch loops iterate."""
    if "set_epoch" in ctx.source:
        ctx.leave("set-epoch-seen", True)
        return
    if "loader" not in ctx.source:
        return
    index = ctx.index
    epoch_loops = [lp for lp in index.epoch_loops() if lp.trains]
    if not epoch_loops:
        return
    reused = _loaders_reused_across_epochs(index, epoch_loops)
    sources = {name.rsplit(".", 1)[-1]: lp for name, lp in reused.items()}
    if sources:
        ctx.leave("TD301-epoch-sources", {name: lp.line for name, lp in sorted(sources.items())})
    factories = {made: reused[name].line for name, made in _made_by_imports(index, reused).items()}
    if factories:
        ctx.leave("TD301-epoch-factories", factories)


def _made_by_imports(index: Index, reused: dict[str, Loop]) -> dict[str, str]:
    """For loaders of these loops bound by `loader = data.build_loader(cfg)` or `train_loader, val_loader =
    create_dataloaders(...)` before the loop, with the function imported from another file: name ->
    `data.build_loader` (`...create_dataloaders#0` for a place in a tuple), so the project pass can join the loop
    to the file whose function builds the loader, whatever the caller names it. One pass over the assignments."""
    found: dict[str, str] = {}
    for stmt in index.nodes(ast.Assign):
        value = stmt.value  # type: ignore[attr-defined]
        if not isinstance(value, ast.Call):
            continue
        for target in stmt.targets:  # type: ignore[attr-defined]
            places = [(target, None)] if isinstance(target, ast.Name) else \
                list(zip(target.elts, range(len(target.elts)), strict=True)) if isinstance(target, ast.Tuple) else []
            for element, position in places:
                if not isinstance(element, ast.Name) or element.id not in reused \
                        or stmt.lineno > reused[element.id].line:  # type: ignore[attr-defined]
                    continue
                q = index.resolve(value.func) if index.local_target(value) is None else None
                if q is None or "." not in q:
                    found.pop(element.id, None)  # rebound by something else: the last binding decides
                    continue
                found[element.id] = q if position is None else f"{q}#{position}"
    return found


def _leave_samplers(ctx: Context, candidates: list[tuple[str, ast.Call, list[Binding]]]) -> None:
    """For the project pass: shuffling DistributedSamplers of a file with no epoch loop and no set_epoch call
    (asv-subtools' `BaseBunch` builds `self.train_loader` on one; trainer.py loops epochs over
    `data.train_loader`)."""
    if "set_epoch" in ctx.source:
        return
    for name, call, loaders in candidates:
        if is_constant(kwarg(call, "shuffle", 3), False) or is_eval_word(name):
            continue
        names = sorted({lb.name.rsplit(".", 1)[-1] for lb in loaders
                        if not is_eval_word(lb.name) and _loader_leaves_file(ctx.index, lb)})
        if names:
            ctx.leave("TD301-sampler", {"line": call.lineno, "col": call.col_offset + 1, "variable": name,
                                        "loaders": names, "returned_by": _returned_by(ctx.index, loaders)})


def _returned_by(index: Index, loaders: list[Binding]) -> list[str]:
    """The module-level functions that return one of these loaders: `build_loader` for `return train_loader`,
    `create_dataloaders#0` for its first place in `return train_loader, val_loader` (the same key
    `_made_by_imports` gives the caller's side)."""
    found: list[str] = []
    for lb in loaders:
        fn = index.function_of(lb.node)
        if not isinstance(fn, ast.FunctionDef) or index.function_of(fn) is not None or index.class_of(fn) is not None:
            continue
        for value in index.returns_of(fn):
            if isinstance(value, ast.Name) and value.id == lb.name:
                found.append(fn.name)
            elif isinstance(value, ast.Tuple):
                found += [f"{fn.name}#{i}" for i, e in enumerate(value.elts) if isinstance(e, ast.Name) and e.id == lb.name]
    return sorted(set(found))


# calls that consume a loader where it is (wrap it, draw from it, measure it), not hand it to other code
_LOCAL_LOADER_USES = frozenset({"cycle", "iter", "next", "enumerate", "len", "zip", "tqdm", "print", "list"})


def _loader_leaves_file(index: Index, loader: Binding) -> bool:
    """Whether another file can iterate this loader: an attribute (`self.train_loader`), a module-level name, a
    local the function returns or hands to a call (`train(model, train_loader)` of engine.py). A local the
    function keeps (CodeT5's run_multi_gen.py builds `train_dataloader` in `main()` and only wraps it in
    `cycle(...)` there) is nobody else's, whatever another script of the project calls its own loader."""
    if "." in loader.name:
        return True
    fn = index.function_of(loader.node)
    if fn is None:
        return True
    if any(isinstance(n, ast.Name) and n.id == loader.name
           for r in index.returns_of(fn) if r is not None for n in ast.walk(r)):
        return True
    for node in ast.walk(fn):  # put in a container: it may travel with it (`loaders = {"train": train_loader}`)
        if isinstance(node, ast.Dict | ast.List | ast.Tuple | ast.Set) and any(
                isinstance(e, ast.Name) and e.id == loader.name for e in [*getattr(node, "elts", ()), *getattr(node, "values", ())]):
            return True
    for call in index.calls_in(fn):
        if last_name(call.func) in _LOCAL_LOADER_USES:
            continue
        if any(isinstance(a, ast.Name) and a.id == loader.name
               for a in [*call.args, *(k.value for k in call.keywords)]):
            return True
    return False


@project("TD301")
def sampler_epoch_not_set_across_files(project: Project) -> list[ProjectHit]:
    """A loader built in one file on a shuffling DistributedSampler, iterated epoch after epoch in another file
    (joined by the loader's attribute name), and no file of the project calls set_epoch at all."""
    if project.any_fact("set-epoch-seen"):
        return []
    loops: dict[str, tuple[str, int]] = {}
    for f, fact in project.facts("TD301-epoch-sources"):
        for name, line in fact.items():
            loops.setdefault(name, (f.path, line))
    # the loop's file names the function that built its loader (`loader = build_loader(cfg)` of data.py): the
    # sampler's file and that function, whatever the loop calls the loader
    by_factory: dict[tuple[str, str], tuple[str, int]] = {}
    for f, fact in project.facts("TD301-epoch-factories"):
        for made, line in fact.items():
            qualified, _, position = made.partition("#")
            for defined_in, local in project.defining(qualified):
                key = (defined_in.path, f"{local}#{position}" if position else local)
                by_factory.setdefault(key, (f.path, line))
    hits = []
    for f, fact in project.facts("TD301-sampler"):
        found = next((loops[n] for n in fact["loaders"] if n in loops), None)
        if found is None:
            found = next((by_factory[(f.path, r)] for r in fact.get("returned_by", ()) if (f.path, r) in by_factory), None)
        if found is not None and found[0] != f.path:
            hits.append(ProjectHit(f.path, fact["line"], fact["col"], {
                "variable": fact["variable"], "loop": f"line {found[1]} of {found[0]}"}))
    return hits


# -- TD302 ---------------------------------------------------------------------------------------


@rule("TD302", ast.Module)
def shuffle_with_sampler(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in index.calls_to(*sorted(index.names["dataloaders"])):
        if is_constant(kwarg(call, "shuffle", 2), True):
            _check_sampler_options(call, ctx)


def _check_sampler_options(node: ast.Call, ctx: Context) -> None:
    for option, position in (("sampler", 3), ("batch_sampler", 4)):
        given = kwarg(node, option, position)
        if given is None or is_constant(given, None):
            continue
        error = (
            "sampler option is mutually exclusive with shuffle"
            if option == "sampler"
            else "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
        )
        conditional = isinstance(given, ast.IfExp) or isinstance(given, ast.Name)
        when = f" whenever `{ctx.segment(given, 40)}` is not None" if conditional else ""
        ctx.report(node, variable=ctx.segment(given, 40), option=option, error=error, when=when)
        return


# -- TD303 ---------------------------------------------------------------------------------------

_SAVES = ("torch.save",)
# Other writers of one file from a whole model or its weights, with where their path and object sit:
# (path keyword, path position, object keyword, object position).
_OTHER_SAVES = {
    "torch.jit.save": ("f", 1, "m", 0),
    "numpy.save": ("file", 0, "arr", 1),
    "numpy.savez": ("file", 0, None, 1),
    "numpy.savez_compressed": ("file", 0, None, 1),
}
_JIT_BUILDERS = frozenset({"torch.jit.script", "torch.jit.trace", "torch.jit.trace_module", "torch.jit.freeze"})
# `save_pretrained` receivers that hold no weights: small text files, written the same by every rank.
_NOT_WEIGHTS = re.compile(r"tokenizer|processor|config|feature_extractor|image_processor|vocab", re.I)


@dataclass(frozen=True)
class Save:
    """One call that writes a model or its weights to a path."""

    call: ast.Call
    what: ast.expr | None  # what it writes
    path: ast.expr | None  # where
    api: str  # how the message spells the call: "torch.save", "torch.jit.save", "unwrapped.save_pretrained"


def _saves(ctx: Context) -> list[Save]:
    """torch.save, and the other ways a model reaches a file (memoised per file): `torch.jit.save`, a scripted or
    traced module's own `.save(path)`, NumPy's `save`/`savez` of weights, and `save_pretrained` (Hugging Face
    models, PEFT adapters, diffusers pipelines) with no `is_main_process=` or `save_function=` of its own.
    `accelerator.save` is not one: accelerate writes from the main process only (accelerate.utils.save)."""

    def find() -> list[Save]:
        index = ctx.index
        found = [Save(c, kwarg(c, "obj", 0), kwarg(c, "f", 1), "torch.save") for c in index.calls_to(*_SAVES)]
        for c in index.calls_to(*_OTHER_SAVES):
            path_key, path_at, what_key, what_at = _OTHER_SAVES[index.callee(c) or ""]
            what = kwarg(c, what_key, what_at) if what_key else (c.args[what_at] if len(c.args) > what_at else None)
            found.append(Save(c, what, kwarg(c, path_key, path_at), ctx.segment(c.func, 30)))
        for c in index.method_calls("save"):
            receiver = c.func.value  # type: ignore[attr-defined]
            if _scripted(index, receiver, c):
                found.append(Save(c, receiver, kwarg(c, "f", 0), ctx.segment(c.func, 40)))
        for c in index.method_calls("save_pretrained"):
            receiver = c.func.value  # type: ignore[attr-defined]
            if any(k.arg in ("is_main_process", "save_function") for k in c.keywords):
                continue  # the call says which process writes
            if _NOT_WEIGHTS.search(dotted(receiver) or ctx.segment(receiver, 60)):
                continue
            found.append(Save(c, receiver, kwarg(c, "save_directory", 0), ctx.segment(c.func, 40)))
        return found

    return ctx.memo("TD303-saves", find)


def _scripted(index: Index, receiver: ast.AST, at: ast.AST) -> bool:
    """A TorchScript module: `torch.jit.script(model)` itself, or a name last assigned one."""
    if isinstance(receiver, ast.Call):
        return index.callee(receiver) in _JIT_BUILDERS
    if isinstance(receiver, ast.Name):
        values = index.definitions(receiver.id, at)
        return bool(values) and isinstance(values[-1], ast.Call) and index.callee(values[-1]) in _JIT_BUILDERS
    return False


def _spelled(ctx: Context, save: Save) -> str:
    what = ctx.segment(save.what, 40) if save.what is not None else "the checkpoint"
    if save.call.func is not None and ctx.index.callee(save.call) in _OTHER_SAVES and save.api.startswith(("np", "numpy")):
        return f"{save.api}(..., {what})"  # NumPy: the path first
    if save.api in ("torch.save", "torch.jit.save") or ctx.index.callee(save.call) in _OTHER_SAVES:
        return f"{save.api}({what}, ...)"
    return f"{save.api}(...)"  # a method of what is written: `scripted.save(path)`, `model.save_pretrained(dir)`


def _names_rank(index: Index, expr: ast.AST | None, _depth: int = 0) -> bool:
    """A path built from the rank (`f"ckpt_rank{rank}.pt"`): one file per rank on purpose."""
    if expr is None:
        return False
    rank_names = index.vocab["rank"]["rank_names"]
    for sub in ast.walk(expr):
        if isinstance(sub, ast.Name | ast.Attribute) and last_name(sub) in rank_names:
            return True
        if isinstance(sub, ast.Call) and last_name(sub.func) in ("get_rank", "get_global_rank", "get_local_rank"):
            return True
    if _depth >= 3:
        return False
    # Names the path is built from, followed to their values: `mb_path = dump / ("mb" + str(args.rank) + ".pth")`;
    # SAM 2's `rank_save = get_rank()` -> `filename = f"data_{salt}_{rank_save}.pkl"` -> `os.path.join(d, filename)`.
    names = {sub.id: sub for sub in ast.walk(expr) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load)}
    return any(_names_rank(index, value, _depth + 1) for sub in names.values()
               for value in index.definitions(sub.id, sub))


_TEMP = re.compile(r"temp|tmp", re.I)


def _temporary(index: Index, expr: ast.AST | None, at: ast.AST) -> bool:
    """A path or file object from `tempfile` (`with tempfile.NamedTemporaryFile() as tmp`): private to each
    process."""
    if expr is None:
        return False
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    if not names:
        return False
    scope = index.function_of(at) or index.tree
    for node in subtree(scope):
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                bound = {n.id for n in ast.walk(item.optional_vars) if isinstance(n, ast.Name)} if item.optional_vars else set()
                if bound & names and isinstance(item.context_expr, ast.Call):
                    if _TEMP.search(index.callee(item.context_expr) or ""):
                        return True
    for name in names:
        values = index.definitions(name, at)
        if values and isinstance(values[-1], ast.Call) and _TEMP.search(index.callee(values[-1]) or ""):
            return True
    return False


def _in_memory(index: Index, expr: ast.AST | None, at: ast.AST) -> bool:
    """`torch.save(obj, buffer)` into an `io.BytesIO()`: not a file."""
    if isinstance(expr, ast.Call):
        return last_name(expr.func) == "BytesIO"
    if isinstance(expr, ast.Name):
        values = index.definitions(expr.id, at)
        return bool(values) and isinstance(values[-1], ast.Call) and last_name(values[-1].func) == "BytesIO"
    return False


def _zero_test(index: Index, test: ast.AST) -> bool:
    """A condition true on the main process only: the index's rank-zero tests, plus the first process of
    each node (`args.rank % ngpus_per_node == 0`, PyTorch's ImageNet example), also inside `and`/`or`."""
    if index.is_rank_zero_test(test):
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mod) and is_constant(right, 0):
            # the first process of each node: never one process when only global-rank tests count
            return last_name(left.left) in index.vocab["rank"]["rank_names"] and not index._global_only
        return False
    if isinstance(test, ast.BoolOp):
        if isinstance(test.op, ast.And):
            return any(_zero_test(index, v) for v in test.values)
        # `not args.multiprocessing_distributed or (... and args.rank % ngpus_per_node == 0)`
        single = [isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not) for v in test.values]
        zero = [_zero_test(index, v) for v in test.values]
        return any(zero) and all(z or one for z, one in zip(zero, single, strict=True))
    return False


_DISTRIBUTED_FLAGS = frozenset(
    {"ddp", "distributed", "is_distributed", "use_ddp", "multiprocessing_distributed", "is_initialized"}
)


def _single_process_test(test: ast.AST) -> bool:
    """`if not ddp:` / `if not dist.is_initialized():` / `if world_size == 1:`: only one process runs."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return last_name(test.operand) in _DISTRIBUTED_FLAGS
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and last_name(test.left) in ("world_size", "WORLD_SIZE"):
        op, right = test.ops[0], test.comparators[0]  # `world_size == 1`, `<= 1`, `< 2`
        return isinstance(op, ast.Eq | ast.LtE) and is_constant(right, 1) or isinstance(op, ast.Lt) and is_constant(right, 2)
    return False


def _main_process_only(index: Index, node: ast.AST, depth: int = 0) -> bool:
    """Whether `node` runs on one process: the index's rank guards, the per-node guards above,
    single-process branches, and functions whose every caller in the file is guarded."""
    if index.rank_guarded(node):
        return True
    child = node
    for anc in index.ancestors(node):
        if isinstance(anc, ast.If) and child in anc.body and (_zero_test(index, anc.test) or _single_process_test(anc.test)):
            return True
        if isinstance(anc, ast.FunctionDef | ast.AsyncFunctionDef):
            callers = index.callers(anc)
            return bool(callers) and depth < 4 and all(_main_process_only(index, c, depth + 1) for c in callers)
        child = anc
    return False


@rule("TD303", ast.Module)
def save_on_all_ranks(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    _leave_call_guards(ctx)  # for saves in other files' functions that this file's training code calls
    leave_sites(ctx)  # every call of another file's function, with its rank guard (callcontext.py)
    saves = _saves(ctx)
    if not saves:
        return
    setup = _distributed_setup(ctx)
    if setup is None:
        _leave_unguarded_helpers(ctx, saves)  # a helper module (checkpoint.py): its callers may run on every rank
        return
    for save in saves:
        call, path = save.call, save.path
        if _names_rank(index, path) or _in_memory(index, path, call) or _temporary(index, path, call):
            continue
        runs_on = _EVERY_RANK
        if _main_process_only(index, call):
            with index.global_rank_only():
                if _main_process_only(index, call):
                    continue
            runs_on = _EVERY_NODE  # `if local_rank == 0:`: one writer per node, all on the same path
        what = save.what
        values = dict(
            variable=ctx.segment(what, 40) if what is not None else "the checkpoint",
            call=_spelled(ctx, save),
            path=ctx.segment(path, 40) if path is not None else "",
            setup=ctx.segment(setup.func, 40),  # type: ignore[attr-defined]
            runs_on=runs_on,
        )
        where = _node_guard_site(index, call) if runs_on == _EVERY_NODE else call
        if runs_on == _EVERY_RANK:
            mixed = _unguarded_of_mixed_calls(index, call)
            if mixed:
                # the file guards some calls of its save helper and not others: the guard belongs at the call
                # sites, and the unguarded ones are the lines to change (awesome-semantic-segmentation-pytorch's
                # `validation()` calls `save_checkpoint(...)` while `train()` tests `save_to_disk` first)
                for site, guarded in mixed:
                    ctx.report(site, **{**values, "runs_on": f"every rank (through `{ctx.segment(site.func, 30)}"
                                        f"(...)`, called here with no rank test while the call at line "
                                        f"{guarded.lineno} has one)"})
                continue
        fn = _outermost_uncalled(index, call)
        if fn is not None:
            # `def save_networks(self, epoch): ... torch.save(...)`, called from nowhere in this file: another
            # file's training loop calls it, maybe under `if rank_0:`. The project pass decides.
            ctx.leave("TD303-pending", {"function": fn.name, "line": where.lineno, "col": where.col_offset + 1,
                                        "values": values})
            continue
        ctx.report(where, **values)


def _unguarded_of_mixed_calls(index: Index, save: ast.Call) -> list[tuple[ast.Call, ast.Call]]:
    """(unguarded call, a guarded call) for the direct calls in this file of the function holding `save`, when at
    least one of them runs on the main process only and at least one does not; empty otherwise."""
    fn = index.function_of(save)
    if fn is None or index.function_of(fn) is not None:
        return []  # top-level code, or a closure: its callers are not the question
    callers = index.callers(fn)
    guarded = [c for c in callers if _main_process_only(index, c)]
    if not guarded or len(guarded) == len(callers):
        return []
    return [(c, guarded[0]) for c in callers if c not in guarded and isinstance(c, ast.Call)]


def _leave_unguarded_helpers(ctx: Context, saves: list[Save]) -> None:
    """For the project pass: the functions of a file with no distributed setup of its own that write a file with
    torch.save and no rank test (`def save_checkpoint(model, optimizer, ...): torch.save(to_save, path)` in
    efficient-video-recognition's checkpoint.py). The file that sets up the process group and calls them on every
    rank is where the finding goes."""
    index = ctx.index
    for save in saves:
        call, path = save.call, save.path
        if _names_rank(index, path) or _in_memory(index, path, call) or _temporary(index, path, call):
            continue
        if _main_process_only(index, call):
            continue
        holder = index.function_of(call)
        if holder is not None and isinstance(index.parent(holder), ast.ClassDef):
            _leave_method_helpers(ctx, holder, save)  # subclasses in other files call them through `self.`
            continue
        fn = _outermost_uncalled(index, call)
        if fn is None:
            continue
        what = save.what
        ctx.leave("TD303-helper", {"function": fn.name, "call": _spelled(ctx, save),
                                   "variable": ctx.segment(what, 40) if what is not None else "the checkpoint"})


def _leave_method_helpers(ctx: Context, method: ast.AST, found: Save) -> None:
    """For the project pass: the methods of a class that reach an unguarded torch.save through `self.` calls
    (scrl's `BYOLBasedTrainer.save_best_checkpoint` -> `self._save_checkpoint('best')` -> torch.save). A subclass in
    another file that calls one of them on every rank writes the file from every process."""
    index = ctx.index
    save = found.call
    info = index.class_of(save)
    if info is None:
        return
    reach = {method}
    changed = True
    while changed:
        changed = False
        for fn in list(reach):
            for caller in index.callers(fn):
                outer = index.function_of(caller)
                if outer is not None and outer not in reach and index.parent(outer) is info.node and \
                        not _main_process_only(index, caller):
                    reach.add(outer)
                    changed = True
    what = found.what
    ctx.leave("TD303-method-helper", {"class": info.node.name, "methods": sorted(f.name for f in reach),  # type: ignore[attr-defined]
                                      "call": _spelled(ctx, found),
                                      "variable": ctx.segment(what, 40) if what is not None else "the checkpoint"})


def _node_guard_site(index: Index, node: ast.AST, depth: int = 0) -> ast.AST:
    """Where a save that runs once per node is decided: the save itself under `if local_rank == 0:`, or the
    call of the helper holding it (`if self.local_rank == 0: self._save_snapshot(epoch)`), which the fix changes."""
    child = node
    for anc in index.ancestors(node):
        if isinstance(anc, ast.If) and child in anc.body and _zero_test(index, anc.test):
            return node
        if isinstance(anc, ast.FunctionDef | ast.AsyncFunctionDef):
            callers = index.callers(anc)
            return _node_guard_site(index, callers[0], depth + 1) if callers and depth < 4 else node
        child = anc
    return node


_EVERY_RANK = "every rank"
_EVERY_NODE = "the first process of every node (its guard tests the local rank, not the global one)"


def _outermost_uncalled(index: Index, call: ast.Call) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function (or method) holding `call` when nothing in this file calls it, directly or through the
    functions that call it."""
    fn = index.function_of(call)
    seen = 0
    while fn is not None and seen < 4:
        callers = index.callers(fn)
        if not callers:
            return fn if fn.name not in ("main", "__init__") else None
        outer = {index.function_of(c) for c in callers}
        if len(outer) != 1 or None in outer:
            return None
        fn = outer.pop()
        seen += 1
    return None


def _leave_call_guards(ctx: Context) -> None:
    """For the project pass: calls of save helpers (`model.save_networks(epoch)`, `trainer.save_checkpoint()`)
    by name, and whether each runs on the main process only (`if rank_0: ...`). Helpers that write checkpoints
    are named for it; reading every call of the file would cost more than it finds."""
    index = ctx.index
    for name, calls in index.calls_by_method.items():
        if _SAVE_HELPER.search(name):
            for call in calls:
                _leave_guard(ctx, call)
    for name, calls in index.calls_by_name.items():
        if _names_a_save(name):
            for call in calls:
                _leave_guard(ctx, call)


_SAVE_HELPER = re.compile(r"save|checkpoint|snapshot|export|dump", re.IGNORECASE)


@lru_cache(maxsize=1 << 16)
def _names_a_save(callee: str) -> bool:
    """Whether a callee's last name is a save helper's; kept per name: most callees (`torch.nn.functional.relu`,
    `self.conv1`) recur across the files of a project, and the search was 0.7 % of `check` on torch's own tree."""
    return _SAVE_HELPER.search(callee.rsplit(".", 1)[-1]) is not None


def _leave_guard(ctx: Context, call: ast.Call) -> None:
    index = ctx.index
    if not isinstance(index.parent(call), ast.Expr):
        return  # a save helper is called as a statement: `model.save_networks(epoch)`
    name = last_name(call.func)
    if not name or index.local_target(call) is not None:  # calls of this file's own functions are resolved here
        return
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and last_name(func.value.func) == "super":
        return  # `super().save_networks(epoch)` in an override: it runs where the override is called
    q = index.resolve(call.func) or ""
    if q.split(".", 1)[0] in ("torch", "numpy", "np", "os", "logging", "wandb", "safetensors"):
        return
    guarded = once = _main_process_only(index, call)
    if guarded:
        with index.global_rank_only():
            once = _main_process_only(index, call)
    setup = _distributed_setup(ctx)
    fact = {"name": name, "guarded": guarded, "once": once, "line": call.lineno,
            "col": call.col_offset + 1, "callee": q or dotted(call.func) or name,
            "setup": ctx.segment(setup.func, 40) if setup is not None else None}  # type: ignore[attr-defined]
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        info = index.class_of(call)
        fn = index.function_of(call)
        # `self.save_best_checkpoint()` of a base class of another file; a rank test elsewhere in the same
        # method (`if comm.is_main_process(): self.save_checkpoint(epoch)`) says the method runs on every rank
        fact["bases"] = info.bases if info is not None else []
        test = next((n.test for n in ast.walk(fn) if isinstance(n, ast.If) and _zero_test(index, n.test)), None) \
            if fn is not None else None
        while isinstance(test, ast.BoolOp):  # the rank test itself, not the `and` around it
            test = next((v for v in test.values if _zero_test(index, v)), None)
        fact["rank_tested"] = ctx.segment(test, 40) if test is not None else None
    ctx.leave("call-guard", fact)


@project("TD303")
def save_on_all_ranks_across_files(project: Project) -> list[ProjectHit]:
    """base_model.py's `save_networks` writes with torch.save, and train.py calls `model.save_networks(epoch)`
    only under `if rank_0:`: one process writes. Reported when some call of it is not guarded, or none is seen."""
    hits = _unguarded_helper_calls(project) + _unguarded_inherited_helper_calls(project)
    pending = list(project.facts("TD303-pending"))
    if not pending:
        return hits
    guards: dict[str, list[bool]] = {}
    once: dict[str, list[bool]] = {}  # guarded by a global-rank test, not only by `local_rank == 0`
    for _f, fact in project.facts("call-guard"):
        guards.setdefault(fact["name"], []).append(fact["guarded"])
        once.setdefault(fact["name"], []).append(fact.get("once", fact["guarded"]))
    context = call_context(project)
    for f, fact in pending:
        seen = guards.get(fact["function"], [])
        values = fact["values"]
        if not seen and context.callers_all(f, fact["function"], "rank_zero"):
            continue  # a helper not named for saving (`on_epoch_end`), called only on the main process
        if seen and all(seen):
            if all(once[fact["function"]]):
                continue
            values = {**values, "runs_on": _EVERY_NODE}  # guarded by `local_rank == 0` at some call site
        hits.append(ProjectHit(f.path, fact["line"], fact["col"], values))
    return hits


def _unguarded_helper_calls(project: Project) -> list[ProjectHit]:
    """main.py sets up DDP and calls `checkpoint.save_checkpoint(...)` with no rank test; checkpoint.py's
    save_checkpoint writes with torch.save and tests no rank either: every process writes the file. Reported at the
    call, where the guard belongs, when the call names a module of the project that defines the helper."""
    helpers: dict[tuple[str, str], str] = {}
    for f, fact in project.facts("TD303-helper"):
        helpers.setdefault((f.module, fact["function"]), fact)
    if not helpers:
        return []
    hits: dict[tuple[str, int, int], ProjectHit] = {}  # a call is left once by method name, once by callee name
    for f, fact in project.facts("call-guard"):
        if fact.get("guarded") or not fact.get("setup") or "line" not in fact:
            continue
        owners = [(g.module, name) for g, name in project.defining(fact["callee"])] if "." in fact["callee"] else []
        helper = next((helpers[o] for o in owners if o in helpers), None)
        if helper is None:
            continue
        hits.setdefault((f.path, fact["line"], fact["col"]), ProjectHit(f.path, fact["line"], fact["col"], {
            "variable": helper["variable"], "call": helper.get("call") or f"torch.save({helper['variable']}, ...)",
            "path": "", "setup": fact["setup"],
            "runs_on": f"every rank (through `{fact['callee']}(...)`, which tests no rank itself)"}))
    return list(hits.values())


def _unguarded_inherited_helper_calls(project: Project) -> list[ProjectHit]:
    """trainer.py's `SCRLTrainer(BYOLBasedTrainer)` calls `self.save_best_checkpoint()` with no rank test, in a
    method that guards its other save with `comm.is_main_process()`; base.py's `BYOLBasedTrainer` writes that
    checkpoint with torch.save and tests no rank: every process writes it (scrl #5). Reported at the call."""
    helpers: dict[tuple[str, str], dict[str, Any]] = {}
    for f, fact in project.facts("TD303-method-helper"):
        helpers.setdefault((f.module, fact["class"]), fact)
    if not helpers:
        return []
    hits: dict[tuple[str, int, int], ProjectHit] = {}  # a call is left once by method name, once by callee name
    for f, fact in project.facts("call-guard"):
        if fact.get("guarded") or not (fact.get("setup") or fact.get("rank_tested")) or not fact.get("bases"):
            continue
        method = fact["callee"].rsplit(".", 1)[-1]
        for base in fact["bases"]:
            found = [helpers.get((g.module, name)) for g, name in project.defining(base)] if "." in base else []
            helper = next((h for h in found if h is not None and method in h["methods"]), None)
            if helper is None:
                continue
            hits.setdefault((f.path, fact["line"], fact["col"]), ProjectHit(f.path, fact["line"], fact["col"], {
                "variable": helper["variable"], "path": "",
                "call": helper.get("call") or f"torch.save({helper['variable']}, ...)",
                "setup": fact.get("setup") or fact["rank_tested"],
                "runs_on": f"every rank (through `{fact['callee']}()` of `{helper['class']}`, which tests no rank "
                           "itself, while this method tests the rank before other work)"}))
            break
    return list(hits.values())


# -- TD304 ---------------------------------------------------------------------------------------


def _saved_expressions(index: Index, call: ast.Call) -> list[ast.AST]:
    """What a save call writes: its first argument, plus the values of names in it (one hop, same scope)."""
    obj = kwarg(call, "obj", 0) or kwarg(call, "tensors", 0)
    if obj is None:
        return []
    found: list[ast.AST] = [obj]
    for sub in ast.walk(obj):
        if isinstance(sub, ast.Name):
            found += index.definitions(sub.id, call)
    return found


def _parameter_of_other_scope(index: Index, receiver: ast.AST, at: ast.AST, b: Binding) -> bool:
    """The receiver is a parameter of the function holding `at`, and the binding was made elsewhere. `self.model`
    bound in another method of the same class is the same object."""
    fn = index.function_of(at)
    root = (dotted(receiver) or "").split(".", 1)[0]
    if fn is None or not root:
        return False
    if root == "self" and b.name.startswith("self.") and (here := index.class_of(at)) is not None \
            and (there := index.class_of(b.node)) is not None and here.node is there.node:
        return False
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    return root in params and index.function_of(b.node) is not fn


def _prefixing_wrapper(index: Index, b: Binding | None) -> bool:
    """A module whose `state_dict()` keys carry a wrapper's `module.` prefix: DDP, DataParallel, or a framework
    wrapper that is DDP on several processes (vocabulary.toml [frameworks]: Accelerate's `prepare`; not Fabric's
    `setup`, whose `state_dict` is the original module's)."""
    if b is None or b.kind != "module":
        return False
    if b.wrapper in ("ddp", "dp"):
        return True
    facts = index.vocab["frameworks"].get(b.wrapper or "")
    return bool(facts and facts["wrapped_state_dict_prefix"])


def _wrapper_words(index: Index, b: Binding, name: str) -> tuple[str, str]:
    """(the wrapper as the message names it, the expression that reaches the model inside it)."""
    if b.wrapper == "ddp":
        return "DistributedDataParallel", f"{name}.module"
    if b.wrapper == "dp":
        return "DataParallel", f"{name}.module"
    runner = next((dotted(c.func.value) for c in ast.walk(b.node)  # type: ignore[attr-defined]
                   if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "prepare"),
                  None) or "accelerator"
    return (f"DistributedDataParallel (what `{runner}.prepare` wraps it in on several processes)",
            f"{runner}.unwrap_model({name})")


def _other_branch_unwraps(index: Index, call: ast.Call, receiver: ast.AST) -> bool:
    """`a if c else b` where this call is one branch and the other reads `<receiver>.module`: the code wraps the
    model on one path (ffjord's `DataParallel` only under CUDA) and unwraps it on that path itself."""
    parent = index.parent(call)
    if not isinstance(parent, ast.IfExp) or call is parent.test:
        return False
    other = parent.orelse if call is parent.body else parent.body
    name = dotted(receiver)
    return any(isinstance(n, ast.Attribute) and n.attr == "module" and dotted(n.value) == name
               for n in ast.walk(other))


@rule("TD304", ast.Module)
def ddp_state_dict_saved(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    saves = index.calls_to("torch.save", "safetensors.torch.save_file")
    saves += [c for c in index.method_calls("save") if index.framework_call(c, "save")]  # `accelerator.save(sd, f)`
    if not saves or not any(_prefixing_wrapper(index, b) for b in index.bindings_of("module")):
        return
    for call in index.method_calls("load_state_dict"):
        b = _binding_at(index, call.func.value, call)  # type: ignore[attr-defined]
        if _prefixing_wrapper(index, b):
            return  # the checkpoint goes back into a wrapped model: the prefix is what it expects
    reported: set[ast.AST] = set()
    for save in saves:
        for expr in _saved_expressions(index, save):
            for sub in ast.walk(expr):
                if not (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Attribute)
                    and sub.func.attr == "state_dict"
                    and sub not in reported
                ):
                    continue
                receiver = sub.func.value
                b = _binding_at(index, receiver, sub)
                if b is None or not _prefixing_wrapper(index, b):
                    continue
                if _parameter_of_other_scope(index, receiver, sub, b):
                    continue  # `def save(model): ...`: which model the caller passes is unknown
                if _other_branch_unwraps(index, sub, receiver):
                    continue  # `model.module.state_dict() if cuda else model.state_dict()`: wrapped on one path only
                local = index.definitions(dotted(receiver) or "", sub)
                if local and not any(v is local[-1] for v in ast.walk(b.node)):
                    continue  # rebound here to what the index cannot read: `inner_model = unwrap(model.inner_model)`
                reported.add(sub)
                name = dotted(receiver) or "model"
                wrapper, unwrapped = _wrapper_words(index, b, name)
                ctx.report(sub, variable=name, wrapper=wrapper, save=ctx.segment(save.func, 30), prefix="module.",
                           unwrapped=unwrapped)


# -- TD305 ---------------------------------------------------------------------------------------


def _syncs_every_backward(index: Index, b: Binding) -> bool:
    """A DDP model, or one a framework wrapped that all-reduces in every backward on several processes
    (vocabulary.toml [frameworks]: Accelerate's `prepare`, Fabric's `setup`)."""
    if b.kind != "module":
        return False
    if b.wrapper == "ddp":
        return True
    facts = index.vocab["frameworks"].get(b.wrapper or "")
    return bool(facts and facts["syncs_every_backward"]) and not index.single_process_runner(b.wrapper or "") \
        and not index.sharded_runner(b.wrapper or "")


def _ddp_model_called(index: Index, loop: Loop) -> Binding | None:
    """The binding of a DDP-wrapped model the loop calls (its forward runs there), if any."""
    for call in loop.all_calls():
        func = call.func
        if not isinstance(func, ast.Name | ast.Attribute):
            continue
        b = _binding_at(index, func, call)
        if b is None or not _syncs_every_backward(index, b):
            continue
        if not _parameter_of_other_scope(index, func, call, b):
            return b
    return None


def _sync_switch(index: Index, b: Binding, model: str, runner: str | None) -> str:
    """How this model's wrapper skips the all-reduce on a micro-step, in the fix's words."""
    if b.wrapper == "fabric":
        return (f"run the forward and backward under `{runner or 'fabric'}.no_backward_sync({model}, "
                "enabled=not last_micro_step)`")
    if b.wrapper == "accelerate":
        return (f"run the forward and backward under `{runner or 'accelerator'}.no_sync({model})` when the step "
                f"is not the last, or let `{runner or 'accelerator'}.accumulate({model})` choose")
    return (f"run the forward and backward under `{model}.no_sync()` when the step is not the last "
            f"(`with {model}.no_sync() if not last_micro_step else nullcontext():`), or set "
            f"`{model}.require_backward_grad_sync = last_micro_step` before the forward as nanoGPT does")


@rule("TD305", ast.Module)
def accumulation_without_no_sync(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    if not index.backward_calls or not any(_syncs_every_backward(index, b) for b in index.bindings_of("module")):
        return
    if "no_sync" in ctx.source or "require_backward_grad_sync" in ctx.source or index.method_calls("accumulate"):
        return  # synchronisation is already switched (no_sync, nanoGPT's flag, accelerate's accumulate)
    switches = {m for facts in index.vocab["frameworks"].values() for m in facts["no_sync"]}
    if any(index.framework_call(c, "no_sync") for m in sorted(switches) for c in index.method_calls(m)):
        return  # a framework's own switch: Fabric's `no_backward_sync`
    for acc in accumulations(ctx, framework_backward=True):
        b = _ddp_model_called(index, acc.loop)
        if b is None:
            continue  # the loop runs no model we know to be DDP-wrapped
        call = acc.backward[0]
        model = b.name
        runner = dotted(call.func.value) if index.framework_call(call, "backward") else None  # type: ignore[attr-defined]
        n = number(ctx, acc.count, call)
        values = dict(
            variable=ctx.segment(call, 50),
            model=model,
            accum_expr=ctx.segment(acc.count, 40),
            sync_switch=_sync_switch(index, b, model, runner),
        )
        if n is not None and n == int(n):
            values.update(micro_steps=int(n), allreduces_per_step=int(n))
        ctx.report(call, **values)


# -- TD306 ---------------------------------------------------------------------------------------


def _mentions_nccl(index: Index, expr: ast.AST | None, at: ast.AST, depth: int = 0) -> bool:
    if expr is None or depth > 3:
        return False
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str) and "nccl" in expr.value.lower()
    if isinstance(expr, ast.IfExp):
        return _mentions_nccl(index, expr.body, at, depth + 1) or _mentions_nccl(index, expr.orelse, at, depth + 1)
    if isinstance(expr, ast.Attribute):
        return expr.attr == "NCCL"  # dist.Backend.NCCL
    if isinstance(expr, ast.Name):
        values = index.definitions(expr.id, at) or [v for _, v in index.defs(index.tree).get(expr.id, [])]
        return any(_mentions_nccl(index, v, v, depth + 1) for v in values)
    return False


_DEVICE_BINDERS = ("set_device", "set_device_index")


def _binds_device(ctx: Context) -> bool:
    """torch.cuda.set_device / torch.accelerator.set_device_index / `with torch.cuda.device(i)` /
    CUDA_VISIBLE_DEVICES set per process anywhere in the file."""
    index = ctx.index
    if any(index.method_calls(m) for m in _DEVICE_BINDERS):
        return True
    if index.calls_to("torch.cuda.set_device", "torch.accelerator.set_device_index", "torch.cuda.device"):
        return True
    if index.calls_to(*index.names["device_binding_calls"]):
        return True  # `self._device = utils.get_device(device=cfg.device)` in a torchtune recipe
    # a bare `set_device(i)` spells the word in the text (the parser normalises identifiers: only an ASCII text
    # is sure to), so most files skip the loop over every call
    if ("set_device" in ctx.source or not ctx.source.isascii()) \
            and any(isinstance(c.func, ast.Name) and c.func.id in _DEVICE_BINDERS for c in index.nodes(ast.Call)):
        return True
    return "CUDA_VISIBLE_DEVICES" in ctx.source


@rule("TD306", ast.Module)
def nccl_without_set_device(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    if _binds_device(ctx):
        ctx.leave("binds-device", True)  # the project pass: a set_device in any file binds the processes
        return
    for call in index.calls_to("torch.distributed.init_process_group"):
        if kwarg(call, "device_id") is not None:
            continue  # bound to a device explicitly
        if is_constant(kwarg(call, "world_size", 3), 1):
            continue  # one process (lightweight-gan's group for SyncBatchNorm on one GPU): cuda:0 is its device
        if not _mentions_nccl(index, kwarg(call, "backend", 0), call):
            continue
        ctx.leave("TD306", {"line": call.lineno, "col": call.col_offset + 1,
                            "values": {"variable": ctx.segment(call, 60)}})


@project("TD306")
def nccl_without_set_device_in_project(project: Project) -> list[ProjectHit]:
    """`setup()` in utils.py initialises NCCL, `main.py` calls `torch.cuda.set_device`: the binding is there."""
    if project.any_fact("binds-device"):
        return []
    return [ProjectHit(f.path, c["line"], c["col"], c["values"]) for f, c in project.facts("TD306")]


# -- TD307 ---------------------------------------------------------------------------------------

_COLLECTIVE_PREFIX = "torch.distributed."


def _wrapped_class(index: Index, b: Binding) -> str | None:
    """The class a DDP binding wraps, also for `DDP(Net(...).cuda(), ...)` built in place."""
    if b.cls is not None or b.call is None:
        return b.cls
    inner = kwarg(b.call, "module", 0)
    same = index.names["same_object_methods"]
    while isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr in same:
        inner = inner.func.value
    if isinstance(inner, ast.Call):
        return dotted(inner.func)
    return None


def _ddp_classes(ctx: Context) -> set[str]:
    """Local nn.Module classes that run under DDP: wrapped models and their submodule classes."""

    def build() -> set[str]:
        index = ctx.index
        roots = {_wrapped_class(index, b) for b in index.bindings_of("module") if b.wrapper == "ddp"}
        roots &= set(index.classes)
        seen: set[str] = set()
        todo = list(roots)
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            info = index.classes[name]
            for sub in ast.walk(info.node):
                if isinstance(sub, ast.Call):
                    local = dotted(sub.func)
                    if local in index.classes and index.classes[local].is_module and local not in seen:
                        todo.append(local)
            # subclasses of a wrapped class are not wrapped by this; bases share its forward
            for base in info.bases:
                if base in index.classes and base not in seen:
                    todo.append(base)
        return seen

    return ctx.memo("ddp-classes", build)


def _registered_tensors(ctx: Context, info: ClassInfo) -> dict[str, str]:
    """Parameters and buffers of a class by attribute name: "parameter" | "buffer"."""

    def build() -> dict[str, str]:
        index = ctx.index
        found: dict[str, str] = {}
        for a in index.self_assignments(info, None):
            if isinstance(a.value, ast.Call):
                q = index.resolve(a.value.func)
                if q == "torch.nn.Parameter":
                    found[a.attr] = "parameter"
                elif q == "torch.nn.Buffer":
                    found[a.attr] = "buffer"
        for method, kind in (("register_buffer", "buffer"), ("register_parameter", "parameter")):
            for call in index.method_calls(method):
                if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
                    if index.class_of(call) is info or (
                        index.class_of(call) is not None and index.class_of(call).node is info.node  # type: ignore[union-attr]
                    ):
                        found[call.args[0].value] = kind
        return found

    return ctx.memo(("registered-tensors", info.node), build)


_INPLACE = re.compile(r"^[a-z]\w*_$")

_CONSEQUENCE = {
    "write-parameter": (
        "PyTorch refuses the in-place write (\"a view of a leaf Variable that requires grad is being used in an "
        "in-place operation\"), and if only some ranks reach it, the others wait in the next all-reduce"
    ),
    "write-buffer": (
        "the view's elements share memory, so PyTorch refuses the in-place write (\"more than one element of the "
        "written-to tensor refers to a single memory location\"), and if only some ranks reach it, the others "
        "wait in the next all-reduce"
    ),
    "register": (
        "DDP broadcasts parameters and buffers from rank 0 into every rank's tensors, and writing into a stride-0 "
        "tensor fails"
    ),
    "collective": "NCCL requires contiguous tensors (\"Tensors must be contiguous\"), and the result is written into memory the view shares",
}


def _risky_use(index: Index, expand: ast.Call, fn: ast.AST, registered: dict[str, str]) -> tuple[str, str] | None:
    """(how the expanded view is used, which consequence) for a use that matters under DDP, else None."""
    parent = index.parent(expand)
    if isinstance(parent, ast.Attribute) and _INPLACE.match(parent.attr):
        return f"the expanded view is written in place by `.{parent.attr}()`", "write"
    if isinstance(parent, ast.Assign):
        for target in parent.targets:
            if isinstance(target, ast.Attribute) and dotted(target.value) == "self" and target.attr in registered:
                return f"the expanded view is stored into the {registered[target.attr]} `self.{target.attr}`", "register"
    if isinstance(parent, ast.Call):
        q = index.resolve(parent.func) or ""
        if q.startswith(_COLLECTIVE_PREFIX):
            return f"the expanded view is passed to `{q}`", "collective"
        if q in ("torch.nn.Parameter", "torch.nn.Buffer") or last_name(parent.func) in ("register_buffer", "register_parameter"):
            return "the expanded view is registered as a parameter or buffer", "register"
    name = None
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
        name = parent.targets[0].id
    if name is None:
        return None
    start = _position(parent)
    view = f"the expanded view `{name}`"
    for sub in ast.walk(fn):
        if _position(sub) <= start:
            continue
        line = getattr(sub, "lineno", 0)
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                if isinstance(target, ast.Subscript) and dotted(target.value) == name:
                    return f"{view} is written in place on line {line}", "write"
                if (
                    isinstance(target, ast.Attribute)
                    and dotted(target.value) == "self"
                    and target.attr in registered
                    and dotted(sub.value) == name
                ):
                    return f"{view} is stored into the {registered[target.attr]} `self.{target.attr}` on line {line}", "register"
        elif isinstance(sub, ast.AugAssign) and dotted(sub.target) == name:
            return f"{view} is updated in place on line {line}", "write"
        elif isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and dotted(func.value) == name and _INPLACE.match(func.attr):
                return f"{view} is written in place by `.{func.attr}()` on line {line}", "write"
            args = [*sub.args, *(k.value for k in sub.keywords)]
            if any(dotted(a) == name for a in args):
                q = index.resolve(func) or ""
                if q.startswith(_COLLECTIVE_PREFIX):
                    return f"{view} is passed to `{q}` on line {line}", "collective"
                if q in ("torch.nn.Parameter", "torch.nn.Buffer") or last_name(func) in (
                    "register_buffer",
                    "register_parameter",
                ):
                    return f"{view} is registered as a parameter or buffer on line {line}", "register"
    return None


@rule("TD307", ast.Module)
def expand_in_ddp_forward(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    expands = index.method_calls("expand") + index.method_calls("expand_as")
    if expands and _ddp_classes(ctx):
        for call in expands:
            _check_expand(call, ctx)


def _check_expand(node: ast.Call, ctx: Context) -> None:
    func = node.func
    index = ctx.index
    info = index.forward_of(node)
    if info is None or info.name not in _ddp_classes(ctx):
        return
    receiver = func.value
    while isinstance(receiver, ast.Subscript):
        receiver = receiver.value
    if not (isinstance(receiver, ast.Attribute) and dotted(receiver.value) == "self"):
        return
    registered = _registered_tensors(ctx, info)
    kind = registered.get(receiver.attr)
    if kind is None:
        return
    fn = index.function_of(node)
    risky = _risky_use(index, node, fn, registered) if fn is not None else None
    if risky is not None:
        use, consequence = risky
        if consequence == "write":
            consequence = f"write-{kind}"
        detail = f"{use}, and that matters: {_CONSEQUENCE[consequence]}"
        fix = (
            "Materialise the view before that use: `.expand(...).clone()` (or `.repeat(...)`); keep plain "
            "`.expand()` for read-only broadcasting."
        )
    else:
        detail = (
            "it is only read here, which is fine under DDP (expand's backward sums the gradient back to the "
            f"{kind}'s shape, so DDP reduces an ordinary gradient) and cheaper than `.repeat()`; it would matter only "
            "if the view were written in place, stored as a parameter or buffer, or passed to a collective"
        )
        fix = (
            "Nothing to change for a read-only use; `.clone()` the view first if you later write into it, store it "
            "as a parameter or buffer, or pass it to a collective."
        )
    ctx.report(node, variable=f"self.{receiver.attr}", cls=info.name, kind=kind, detail=detail, remedy=fix)


# -- TD308 -------------------------------------------------------------------------------------


_EFFECT_FLAG = "the last micro-step's backward does not all-reduce and the ranks' gradients drift apart"
_EFFECT_NO_SYNC = ("the backward under it all-reduces anyway: this no_sync() changes nothing, and every micro-step "
                   "all-reduces")


@rule("TD308", ast.Module, ast.With, reads=(ast.Assign,))
def grad_sync_set_after_forward(node: ast.Module | ast.With, ctx: Context) -> None:
    if isinstance(node, ast.With):
        _no_sync_after_forward(node, ctx)
        return
    # `model.require_backward_grad_sync = ...`, found in one loop over the file's assignments (before the `with`
    # blocks, as the engine would hand them) rather than by a check called on each assignment
    attribute = ast.Attribute
    for stmt in ctx.index.nodes(ast.Assign):
        target = stmt.targets[0] if len(stmt.targets) == 1 else None  # type: ignore[attr-defined]
        if target.__class__ is attribute and target.attr == "require_backward_grad_sync":  # type: ignore[union-attr]
            _grad_sync_flag_after_forward(stmt, target, ctx)  # type: ignore[arg-type]


def _grad_sync_flag_after_forward(node: ast.Assign, target: ast.Attribute, ctx: Context) -> None:
    model = dotted(target.value)
    loop = ctx.index.loop_of(node)
    if model is None or loop is None:
        return
    here = _position(node)
    # DDP reads the flag in its forward (prepare_for_backward): set after the forward of the same micro-step,
    # it decides the sync of the next micro-step's backward instead of this one's.
    forwards = [c for c in loop.calls if dotted(c.func) == model and _position(c) < here]
    backward = [c for c in loop.calls if c in set(ctx.index.backward_calls) and _position(c) > here]
    if forwards and backward:
        ctx.report(node, variable=model, context=f"{model}.no_sync()", forward=f"the forward `{ctx.segment(forwards[-1], 40)}`",
                   line=forwards[-1].lineno, switch=f"`{model}.require_backward_grad_sync = ...`", effect=_EFFECT_FLAG)


def _no_sync_after_forward(node: ast.With, ctx: Context) -> None:
    """`ret = model(batch)`, then `with model.no_sync(): loss.backward()` (LVSM #22): DDP prepared the all-reduce
    in that forward, with sync on, so the backward inside no_sync() still all-reduces. Also when the loss the
    backward runs on was made before the `with` wherever the forward is (speechbrain's `Brain.fit_batch`:
    `compute_forward` first, then `with self.no_sync(not should_step): loss.backward()`; ClassyVision's
    `run_optimizer(loss)`, handed the loss of `train_step`'s forward): the forward that built it ran with sync on."""
    index = ctx.index
    fn = index.function_of(node)
    start, end = _position(node), (node.end_lineno or node.lineno, node.end_col_offset or 0)
    backwards = [c for c in index.backward_calls if start <= _position(c) <= end and index.function_of(c) is fn]
    if not backwards:
        return
    for item in node.items:
        call = item.context_expr
        model = index.sync_disabling(call, node)
        if model is None:
            continue
        direct = isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "no_sync" \
            and dotted(call.func.value) == model
        context = f"{model}.no_sync()" if direct else ctx.segment(call, 40)
        loop = index.loop_of(node)
        if direct and loop is not None:
            inside = [c for c in loop.calls if start <= _position(c) <= end]
            if any(dotted(c.func) == model for c in inside):
                continue  # the forward runs under no_sync too: the right shape
            forwards = [c for c in loop.calls if dotted(c.func) == model and _position(c) < start]
            if forwards:
                ctx.report(call, variable=model, context=context, forward=f"the forward `{ctx.segment(forwards[-1], 40)}`",
                           line=forwards[-1].lineno, switch=f"`with {context}:`", effect=_EFFECT_NO_SYNC)
                return
        for backward in backwards:
            made = _loss_made_before(index, backward, node)
            if made is None:
                continue
            name, origin = made
            if isinstance(origin, ast.FunctionDef | ast.AsyncFunctionDef):
                callers = index.callers(origin)
                where = f" by `{ctx.segment(callers[0], 40)}`" if callers else ""
                forward = f"the forward that built `{name}`, handed to `{origin.name}`{where}"
                line = callers[0].lineno if callers else origin.lineno
            else:
                forward = f"the forward that built `{name}` (`{ctx.segment(origin, 40)}`)"
                line = origin.lineno
            ctx.report(item.context_expr, variable=model, context=context, forward=forward, line=line,
                       switch=f"`with {context}:`", effect=_EFFECT_NO_SYNC)
            return


def _loss_made_before(index: Index, backward: ast.Call, block: ast.With) -> tuple[str, ast.AST] | None:
    """(name, where it was made) when every tensor the backward runs on (`loss` in `loss.backward()`,
    `scaler.scale(loss / k).backward()`) exists before `block`: assigned before it, outside any other no-sync
    context, or a parameter of the function. None when one is made inside `block`, or we cannot tell."""
    func = backward.func
    receiver = func.value if isinstance(func, ast.Attribute) else (backward.args[0] if backward.args else None)
    if receiver is None:
        return None
    names = [n for n in ast.walk(receiver) if isinstance(n, ast.Name) and n.id != "self"
             and index.kind_of(n, guess=False) not in ("scaler", "optimizer", "module")]
    if not names:
        return None
    found: tuple[str, ast.AST] | None = None
    for n in names:
        origin = index.defined_outside(n.id, backward, block)
        if origin is None:
            return None
        for anc in index.ancestors(origin):
            if isinstance(anc, ast.With) and any(index.sync_disabling(i.context_expr, anc) for i in anc.items):
                return None  # built under no_sync too (several forwards first, then the backwards)
        found = found or (n.id, origin)
    return found


# -- TD309 ---------------------------------------------------------------------------------------


def _residue(test: ast.AST) -> tuple[str, str, int, bool] | None:
    """`(i + a) % n == 0` -> (counter, modulus, -a, True): true on the micro-steps where i = -a (mod n);
    `i % n != 0` -> (..., False): true on every other one. Counter and modulus by their last names
    (`batch_idx`, `accum_grad` for `self.accum_grad` or `loss_dict["batch_idx"]`)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        found = _residue(test.operand)
        return (found[0], found[1], found[2], not found[3]) if found is not None else None
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and is_constant(test.comparators[0], 0)
            and isinstance(test.ops[0], ast.Eq | ast.NotEq)):
        return None
    mod = test.left
    if not (isinstance(mod, ast.BinOp) and isinstance(mod.op, ast.Mod)):
        return None
    counter, offset = mod.left, 0
    if isinstance(counter, ast.BinOp) and isinstance(counter.op, ast.Add) and isinstance(counter.right, ast.Constant) \
            and isinstance(counter.right.value, int):
        counter, offset = counter.left, counter.right.value
    name, modulus = last_name(counter), last_name(mod.right)
    if name is None or modulus is None:
        return None
    return name, modulus, -offset, isinstance(test.ops[0], ast.Eq)


def _step_residues(index: Index, loop: Loop) -> list[tuple[ast.Call, tuple[str, str, int, bool]]]:
    """The modulo tests guarding the optimizer steps a loop runs, in the loop or in a function of the file it
    calls (`self.update_step(...)`, whose body steps under `if (batch_idx + 1) % self.accum_grad == 0`)."""
    out = []
    steps = set(index.step_calls)
    for call in loop.all_calls():
        candidates: list[tuple[ast.Call, ast.AST]] = [(call, loop.node)] if call in steps else []
        fn = index.local_target(call)
        if fn is not None:
            candidates += [(c, fn) for c in index.calls_in(fn) if c in steps]
        for step, stop in candidates:
            for anc in index.ancestors(step):
                if anc is stop:
                    break
                if isinstance(anc, ast.If) and (found := _residue(anc.test)) is not None:
                    out.append((step, found))
                    break
    return out


@rule("TD309", ast.Module)
def no_sync_on_the_stepping_micro_step(node: ast.Module, ctx: Context) -> None:
    """`ctx = model.no_sync if batch_idx % accum != 0 else nullcontext`: DDP syncs when batch_idx % accum == 0,
    while the optimizer steps when (batch_idx + 1) % accum == 0 (FunASR #3472)."""
    if "no_sync" not in ctx.source:
        return
    index = ctx.index
    seen: set[int] = set()
    for loop in index.loops.values():
        for sub in subtree(loop.node):
            if id(sub) in seen or index.loop_of(sub) is not loop:
                continue
            if isinstance(sub, ast.IfExp):
                for branch, chosen in ((sub.body, True), (sub.orelse, False)):
                    target = branch.func if isinstance(branch, ast.Call) else branch
                    if isinstance(target, ast.Attribute) and target.attr == "no_sync":
                        seen.add(id(sub))
                        _check_sync_choice(ctx, loop, sub.test, chosen)
            elif isinstance(sub, ast.If):
                for body, chosen in ((sub.body, True), (sub.orelse, False)):
                    if any(isinstance(n, ast.Attribute) and n.attr == "no_sync" for stmt in body for n in subtree(stmt)):
                        seen.add(id(sub))
                        _check_sync_choice(ctx, loop, sub.test, chosen)


def _check_sync_choice(ctx: Context, loop: Loop, test: ast.expr, no_sync_if_true: bool) -> None:
    found = _residue(test)
    if found is None:
        return
    counter, modulus, residue, equal = found
    # DDP all-reduces on the micro-steps where no_sync is not chosen; with `(i + a) % n != 0` choosing no_sync
    # (or `== 0` choosing the plain context), that is the one micro-step in n where i = -a (mod n).
    if equal == no_sync_if_true:
        return  # sync on all but one micro-step: another mistake, not this rule's
    for step, (s_counter, s_modulus, s_residue, s_equal) in _step_residues(ctx.index, loop):
        if (s_counter, s_modulus) == (counter, modulus) and s_equal and s_residue != residue:
            ctx.report(test, variable=ctx.segment(test, 50), step_call=ctx.segment(step, 40), line=step.lineno)
            return


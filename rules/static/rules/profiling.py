"""TD5xx — performance: the input pipeline (workers, pinned memory, asynchronous copies), torch.compile
and device synchronisations inside the training loop. Docs: profiling.toml."""

from __future__ import annotations

import ast
import re

from torchdoctor.rules.static.api import Context, project, rule
from torchdoctor.rules.static.callcontext import call_context, leave_sites
from torchdoctor.rules.static.index import (
    Binding,
    Index,
    Loop,
    dotted,
    is_constant,
    kwarg,
    last_name,
    looks_like_loader,
)
from torchdoctor.rules.static.patterns import (
    backward_names,
    holds_graph,
    latest_value,
    unpacked_beside_the_loss_from_elsewhere,
)
from torchdoctor.rules.static.project import Project, ProjectHit
from torchdoctor.rules.static.semantic.subtree import subtree
from torchdoctor.rules.static.semantic.syntax import _position

# A script that puts work on a CUDA device: `.cuda(`, "cuda", "cuda:0", f"cuda:{rank}".
# GPU evidence in a file's text: `.cuda(`, a "cuda"/"cuda:0" device string, a `torch.cuda.` API use other than a
# question about the machine (`print(torch.cuda.is_available())` alone puts nothing on a GPU: LLMs-from-scratch's
# CPU notebook), or the "nccl" process-group backend (NCCL runs on GPUs only: a torchrun script that says nothing
# else about CUDA).
GPU_SOURCE = re.compile(
    r"""\.cuda\(|["']cuda(?::\d*)?["']|\bf["']cuda:\{|["']nccl["']"""
    r"""|\btorch\.cuda\.(?!(?:is_available|device_count|get_device_name|get_device_properties|is_bf16_supported)\b)"""
)


def names_a_gpu(source: str) -> bool:
    """GPU_SOURCE in a file's text. Every one of its spellings holds "cuda" or "nccl" and none spans a newline, so
    the regex (no literal prefix: it tries every position it is given) is tried only on the lines that hold one of
    the two words, each line once. Torch's own files say "cuda" in a few lines among thousands; searching the whole
    text from its first character cost about 3 % of `check` over them. The line's bounds are handed to `search`,
    not sliced off: a word boundary at its start still sees the character before it, and its end reads as the
    newline would."""
    for word in ("cuda", "nccl"):
        at = source.find(word)
        while at != -1:
            start = source.rfind("\n", 0, at) + 1
            end = source.find("\n", at)
            if end == -1:
                end = len(source)
            if GPU_SOURCE.search(source, start, end) is not None:
                return True
            at = source.find(word, end)
    return False


# Positional slots of torch.utils.data.DataLoader's arguments.
_LOADER_POSITIONS = {"dataset": 0, "num_workers": 5, "pin_memory": 7}
_SYNCHRONIZE = frozenset(
    {"torch.cuda.synchronize", "torch.accelerator.synchronize", "torch.xpu.synchronize", "torch.mps.synchronize"}
)
_TIMERS = frozenset(
    {
        "time.time",
        "time.perf_counter",
        "time.monotonic",
        "time.time_ns",
        "time.perf_counter_ns",
        "time.monotonic_ns",
        "timeit.default_timer",
    }
)
_PROFILERS = ("torch.profiler.", "torch.autograd.profiler.", "torch.cuda.nvtx.", "torch.cuda.Event")
_SYNC_METHODS = frozenset({"item", "cpu", "tolist", "numpy"})
_SYNC_BUILTINS = frozenset({"print", "float", "int", "bool"})
# Calls that add a value to a running total or a history (`meter.update(loss.item(), n)`).
_ACCUMULATE = frozenset({"append", "extend", "update", "add", "insert", "add_"})


# -- facts several profiling (and other) rules share ----------------------------------------------


def snippet(ctx: Context, node: ast.AST, limit: int = 80) -> str:
    """The user's source text of a node on one line, clipped: `ctx.segment` without re-splitting the
    whole file on every call (it matters for findings in large files)."""
    line, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    lines = ctx.lines
    if line is not None and line == end and 0 < line <= len(lines):
        raw = lines[line - 1].encode("utf-8")
        text = raw[node.col_offset : node.end_col_offset].decode("utf-8", "replace")  # type: ignore[attr-defined]
    else:
        text = ast.unparse(node)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def trains_on_gpu(ctx: Context) -> bool:
    """The file has a training loop and puts work on a CUDA device."""
    return ctx.memo(
        "profiling:trains-on-gpu",
        lambda: bool(ctx.index.training_loops())
        and (names_a_gpu(ctx.source) or ctx.index.uses_accelerate()),
    )


def loader_arg(b: Binding, name: str) -> ast.expr | None:
    """A DataLoader argument by keyword (or by position for torch's own DataLoader)."""
    position = _LOADER_POSITIONS.get(name) if b.cls == "torch.utils.data.DataLoader" else None
    return b.arg(name, position)


def loop_loaders(index: Index, loop: Loop) -> list[Binding]:
    """The DataLoader bindings a loop iterates: its own source, or, for a function parameter
    (`def train(model, loader)`), what every caller in the file passes in."""
    b = loop.source_binding
    if b is not None:
        return [b] if b.kind == "dataloader" and b.call is not None else []
    fn = index.function_of(loop.node)
    if fn is None or loop.source is None or "." in loop.source:
        return []
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if loop.source not in params:
        return []
    position = params.index(loop.source)
    if params and params[0] in ("self", "cls") and isinstance(index.parent(fn), ast.ClassDef):
        position -= 1
    found: list[Binding] = []
    for call in index.callers(fn):
        arg = kwarg(call, loop.source, position)
        passed = index.binding(arg)
        if passed is None or passed.kind != "dataloader" or passed.call is None:
            return []  # one caller passes something we cannot see: say nothing
        found.append(passed)
    return found


def _loader_loops(ctx: Context) -> list[tuple[Loop, list[Binding]]]:
    index = ctx.index

    def build() -> list[tuple[Loop, list[Binding]]]:
        out: list[tuple[Loop, list[Binding]]] = []
        if not any(b.kind == "dataloader" for bs in index.bindings.values() for b in bs):
            return out  # no DataLoader built in this file: nothing to follow
        for loop in index.loops.values():
            if loop.source is None:
                continue
            loaders = loop_loaders(index, loop)
            if loaders:
                out.append((loop, loaders))
        return out

    return ctx.memo("profiling:loader-loops", build)


def batch_names(index: Index, loop: Loop) -> set[str]:
    """Names holding the loop's batch: its targets and what is unpacked or indexed from them."""
    names = set(loop.targets)
    if not names:
        return names
    start, end = loop.node.lineno, loop.node.end_lineno or loop.node.lineno
    for _ in range(2):
        for name, entries in index.defs(loop.scope).items():
            if name in names:
                continue
            for stmt, value in entries:
                if start <= stmt.lineno <= end and _mentions(value, names) and not _is_model_call(index, value):
                    names.add(name)
                    break
    return names


def _mentions(expr: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in subtree(expr))


def _is_model_call(index: Index, expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name | ast.Attribute) and index.is_model(expr.func)


def batch_copies(index: Index, loop: Loop) -> list[ast.Call]:
    """`.to(device)` / `.cuda()` calls in the loop whose receiver is (part of) the batch, including
    `{k: v.to(device) for k, v in batch.items()}`."""
    names = batch_names(index, loop)
    if not names:
        return []
    copies = []
    for call in loop.all_calls():
        func = call.func
        if not isinstance(func, ast.Attribute) or func.attr not in ("to", "cuda"):
            continue
        if func.attr == "to" and not _to_device(index, call):
            continue
        receiver_names = names | _comprehension_targets(index, call, names)
        if _mentions(func.value, receiver_names) and not index.is_model(func.value):
            copies.append(call)
    return copies


def _to_device(index: Index, call: ast.Call) -> bool:
    """`.to(device)`, `.to("cuda")`, `.to(device=...)`: not a dtype-only cast, not a copy to the CPU."""
    target = kwarg(call, "device", 0)
    if target is None:
        return False
    if isinstance(target, ast.Constant):
        return isinstance(target.value, str) and target.value.startswith("cuda")
    q = index.resolve(target) or ""
    return not q.startswith("torch.") or q == "torch.device"


def _comprehension_targets(index: Index, node: ast.AST, names: set[str]) -> set[str]:
    found: set[str] = set()
    for anc in index.ancestors(node):
        if isinstance(anc, ast.ListComp | ast.DictComp | ast.SetComp | ast.GeneratorExp):
            for gen in anc.generators:
                if _mentions(gen.iter, names):
                    found |= {n.id for n in subtree(gen.target) if isinstance(n, ast.Name)}
        elif isinstance(anc, ast.stmt):
            break
    return found


def _on_device_dataset(index: Index, expr: ast.AST | None, depth: int = 0) -> bool:
    """A dataset built from tensors moved to a device: workers and pinning do not apply."""
    if expr is None or depth > 6:
        return False
    if isinstance(expr, ast.Name):
        return _on_device_dataset(index, latest_value(index, expr.id, expr), depth + 1)
    for node in subtree(expr):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("cuda", "to"):
                return True
            if any(kw.arg == "device" for kw in node.keywords):
                return True
    if isinstance(expr, ast.Call):
        return any(_on_device_dataset(index, a, depth + 1) for a in expr.args if isinstance(a, ast.Name))
    return False


# Per-sample work that worker processes take off the training process: file reads, decoding, transforms.
_SAMPLE_WORK = frozenset(
    "open imread imdecode read read_image decode_image decode_jpeg load loadtxt fromfile read_file read_csv "
    "transform transforms augment".split()
)


def _heavy_dataset(index: Index, expr: ast.AST | None, depth: int = 0) -> bool:
    """A dataset whose items cost real work to produce: a torchvision dataset, one built with a
    `transform=`, or a Dataset class of this file whose `__getitem__` reads, decodes or transforms."""
    if expr is None or depth > 6:
        return False
    if isinstance(expr, ast.Name):
        # A Hugging Face dataset with an on-the-fly transform decodes and augments in __getitem__.
        if any(dotted(c.func.value) == expr.id  # type: ignore[attr-defined]
               for c in index.method_calls("set_transform") + index.method_calls("with_transform")):
            return True
        return _heavy_dataset(index, latest_value(index, expr.id, expr), depth + 1)
    if not isinstance(expr, ast.Call):
        return False
    if any(kw.arg in ("transform", "transforms") for kw in expr.keywords):
        return True
    q = index.resolve(expr.func) or ""
    if q.startswith(("torchvision.datasets.", "torchaudio.datasets.", "torchtext.datasets.")):
        return True
    if q.endswith(("random_split", "Subset", "ConcatDataset")) and expr.args:
        return _heavy_dataset(index, expr.args[0], depth + 1)
    info = index.classes.get(dotted(expr.func) or "")
    return info is not None and _heavy_getitem(info)


def _gpu_training_loaders(ctx: Context) -> list[tuple[Binding, Loop]]:
    """(loader, loop) for training loops that copy their batches to the GPU, one per loader."""
    if not trains_on_gpu(ctx):
        return []

    def build() -> list[tuple[Binding, Loop]]:
        index = ctx.index
        seen: set[int] = set()
        out = []
        for loop, loaders in _loader_loops(ctx):
            prepared = any(b.wrapper == "accelerate" for b in loaders)  # Accelerate copies the batches itself
            if not loop.trains or not (prepared or batch_copies(index, loop)):
                continue
            for b in loaders:
                if id(b.call) in seen or b.star_kwargs:
                    continue
                seen.add(id(b.call))
                out.append((b, loop))
        return out

    return ctx.memo("profiling:gpu-training-loaders", build)


def _positive_int(expr: ast.AST | None) -> bool:
    return isinstance(expr, ast.Constant) and type(expr.value) is int and expr.value > 0


# -- rules -------------------------------------------------------------------------------------


@rule("TD501", ast.Module)
def dataloader_without_workers(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    _leave_heavy_dataset_classes(ctx)
    for b, _loop in _gpu_training_loaders(ctx):
        workers = loader_arg(b, "num_workers")
        if workers is not None and not is_constant(workers, 0):
            continue
        dataset = loader_arg(b, "dataset")
        if _on_device_dataset(index, dataset):
            continue
        setting = "num_workers=0" if workers is not None else "num_workers unset (0)"
        if not _heavy_dataset(index, dataset):
            # cheap items (tensors in memory, pre-tokenised data): workers would only add IPC; unless the
            # dataset's class lives in another file of the project, which the project pass reads
            cls = _dataset_class(index, dataset)
            if cls is not None:
                ctx.leave("TD501-loader", {"cls": cls, "line": b.call.lineno, "col": b.call.col_offset + 1,
                                           "variable": b.name, "setting": setting})
            continue
        # A file with backward passes but no optimizer anywhere (fast_adversarial's evaluate_mnist.py: PGD attacks
        # take gradients of the input on a loaded model) updates nothing: "while the model trains" may not hold,
        # and the GPU mostly waits on the attack's own passes. Info, as TD602 does for the same files.
        weak = not index.step_calls and not index.training_step_calls() and not index.bindings_of("optimizer")
        ctx.report(b.call, severity="info" if weak else None, variable=b.name, setting=setting)


def _heavy_getitem(info) -> bool:
    getitem = info.method("__getitem__")
    if getitem is None:
        return False
    for node in subtree(getitem):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in _SAMPLE_WORK:
                return True
    return False


def _leave_heavy_dataset_classes(ctx: Context) -> None:
    """For the project pass: this file's Dataset classes whose __getitem__ reads, decodes or transforms."""
    for name, info in ctx.index.classes.items():
        if "." not in name and _heavy_getitem(info):
            ctx.leave("heavy-dataset", name)


def _dataset_class(index: Index, expr: ast.AST | None, depth: int = 0) -> str | None:
    """The qualified name of the class a dataset is built from, when it is not torch's and not this file's:
    `train_set = NPYDataset_LRD(...)` imported from `datasets.Denoise_dataset`."""
    if expr is None or depth > 4:
        return None
    if isinstance(expr, ast.Name):
        return _dataset_class(index, latest_value(index, expr.id, expr), depth + 1)
    if not isinstance(expr, ast.Call):
        return None
    q = index.resolve(expr.func)
    if not q or q.split(".", 1)[0] in ("torch", "torchvision", "torchaudio", "torchtext", "numpy") \
            or (dotted(expr.func) or "") in index.classes or "." not in q:
        return None
    return q


@project("TD501")
def dataloader_without_workers_across_files(project: Project) -> list[ProjectHit]:
    """train.py builds `DataLoader(NPYDataset_LRD(...), num_workers=0)`; the class's __getitem__ (in
    datasets/Denoise_dataset.py) loads files: the loading runs in the training process."""
    heavy = {(f.module, name) for f, name in project.facts("heavy-dataset")}
    if not heavy:
        return []
    hits = []
    for f, fact in project.facts("TD501-loader"):
        if any((g.module, name) in heavy for g, name in project.defining(fact["cls"])):
            hits.append(ProjectHit(f.path, fact["line"], fact["col"],
                                   {"variable": fact["variable"], "setting": fact["setting"]}))
    return hits


@rule("TD508", ast.Module)
def dataloader_rebuilt_per_epoch(node: ast.Module, ctx: Context) -> None:
    """A DataLoader built on every pass of a training loop, here or in a function of this file it calls; a
    fact for the project pass when the function is called from another file's training loop."""
    index = ctx.index
    for call in index.calls_to(*sorted(index.names["dataloaders"])):
        if not _costly_to_rebuild(index, call):
            continue
        name = _loader_name(index, call)
        loop = _rebuilt_in(index, call)
        if loop is not None:
            where = f"the loop over `{loop.source}`" if loop.source else f"the training loop at line {loop.line}"
            ctx.report(call, variable=name, loop=where, cost=_rebuild_cost(index, call))
            continue
        fn = index.function_of(call)
        if fn is not None and isinstance(index.parent(fn), ast.Module) and index.loop_of(call) is None \
                and not index.guarded_in_function(call) and not _runs_whole_training(index, fn):
            ctx.leave("builds-loader", {"function": fn.name, "line": call.lineno, "col": call.col_offset + 1,
                                        "variable": name, "cost": _rebuild_cost(index, call),
                                        "shaped_by": _params_shaping(index, fn, call)})
    _iterator_rebuilt_per_step(ctx)
    for loop in index.training_loops():
        for call in loop.calls:
            if index.local_target(call) is not None or index.guarded_in_loop(call, loop, rare=True):
                continue
            q = index.resolve(call.func)
            if q and "." in q and q.split(".", 1)[0] not in _LIBRARY_ROOTS:
                where = f"the loop over `{loop.source}`" if loop.source else f"the training loop at line {loop.line}"
                ctx.leave("calls-per-epoch", {"callee": q, "loop": where, "varying": _varying_arguments(call, loop)})


def _iterator_rebuilt_per_step(ctx: Context) -> None:
    """`batch = next(iter(train_loader))` on every pass of a training loop (mead-baseline's pretrain-tlm, #667):
    each step makes a new iterator, so the loader starts its workers again and hands back its first batch (the
    same batch every step when it does not shuffle)."""
    index = ctx.index
    text = ctx.source
    if text.isascii() and ("next" not in text or "iter" not in text):
        return  # `next(iter(...))` spells both names (the parser normalises identifiers: an ASCII text is sure to)
    for call in index.nodes(ast.Call):
        func = call.func  # type: ignore[attr-defined]
        if not (isinstance(func, ast.Name) and func.id == "next" and call.args):  # type: ignore[attr-defined]
            continue
        inner = call.args[0]  # type: ignore[attr-defined]
        if not (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "iter"
                and len(inner.args) == 1):
            continue
        source = inner.args[0]
        b = index.binding(source)
        if not (b is not None and b.kind == "dataloader" or b is None and looks_like_loader(dotted(source))):
            continue
        around = index.loops_around(call)
        training = next((lp for lp in around if lp.trains), None)
        if training is None or index.guarded_in_loop(call, training, rare=True):
            continue
        loop = around[0]  # the innermost: a validation pass inside the epoch loop takes a fresh iterator per batch
        shuffle = kwarg(b.call, "shuffle", 2) if b is not None and b.call is not None else None
        shuffled = shuffle is not None and not is_constant(shuffle, False) and not is_constant(shuffle, None)
        cost = "a new iterator that starts the loader's workers again and yields its first batch" + (
            "" if shuffled else " (the same batch every step, since it does not shuffle)")
        where = f"the loop over `{loop.source}`" if loop.source else \
            f"the {'training ' if loop.trains else ''}loop at line {loop.line}"
        ctx.report(inner, variable=f"iter({ctx.segment(source, 40)})", loop=where, cost=cost)


_LIBRARY_ROOTS = frozenset("torch torchvision numpy np os sys math random time logging json wandb tqdm "
                           "transformers accelerate lightning pytorch_lightning timm datasets".split())


@project("TD508")
def dataloader_rebuilt_across_files(project: Project) -> list[ProjectHit]:
    """train.py's epoch loop calls `test.test(...)`, whose body (test.py) builds its DataLoader every time."""
    builders = {(f.module, fact["function"]): (f, fact) for f, fact in project.facts("builds-loader")}
    if not builders:
        return []
    hits: dict[tuple[str, int], ProjectHit] = {}
    for _f, fact in project.facts("calls-per-epoch"):
        for g, name in project.defining(fact["callee"]):
            found = builders.get((g.module, name))
            if found is not None and not set(found[1].get("shaped_by", [])) & set(fact.get("varying", [])):
                owner, b = found
                hits.setdefault((owner.path, b["line"]), ProjectHit(owner.path, b["line"], b["col"], {
                    "variable": b["variable"], "cost": b["cost"],
                    "loop": f"{fact['loop']} in {_f.path} (through `{fact['callee']}`)"}))
    return list(hits.values())


def _params_shaping(index: Index, fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call) -> list[str]:
    """The parameters of `fn` the loader is built from (directly, or through a name assigned from them in `fn`),
    each as its position ("0") and its name: WaveRNN's `get_tts_datasets(path, batch_size, r)` sizes the batches
    and the collate function from its arguments."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    names = {n.id for n in subtree(call) if isinstance(n, ast.Name)}
    for name in list(names):
        value = latest_value(index, name, call)
        if value is not None and index.function_of(value) is fn:
            names |= {n.id for n in subtree(value) if isinstance(n, ast.Name)}
    out = []
    for i, p in enumerate(params):
        if p in names:
            out += [str(i - (1 if params[0] in ("self", "cls") else 0)), p]
    out += [a.arg for a in fn.args.kwonlyargs if a.arg in names]
    return out


def _varying_arguments(call: ast.Call, loop: Loop) -> list[str]:
    """Which arguments of a call in `loop` change from pass to pass (built from the loop's targets): positions as
    "0", "1", ..., keywords by name."""
    varying = _varying_names(loop)
    out = [str(i) for i, a in enumerate(call.args) if any(isinstance(n, ast.Name) and n.id in varying for n in subtree(a))]
    return out + [k.arg for k in call.keywords
                  if k.arg and any(isinstance(n, ast.Name) and n.id in varying for n in subtree(k.value))]


def _loader_name(index: Index, call: ast.Call) -> str:
    stmt = index.parent(call)
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        return dotted(stmt.targets[0]) or "the DataLoader"
    return "the DataLoader"


def _costly_to_rebuild(index: Index, call: ast.Call) -> bool:
    """Worker processes to start (a `num_workers` that is not 0), or a dataset built in the same place."""
    workers = kwarg(call, "num_workers", _LOADER_POSITIONS["num_workers"] if index.callee(call) == "torch.utils.data.DataLoader" else None)
    if workers is not None and not is_constant(workers, 0):
        return True
    return _dataset_built_here(index, call)


def _dataset_built_here(index: Index, call: ast.Call) -> bool:
    dataset = kwarg(call, "dataset", 0)
    if isinstance(dataset, ast.Name):
        value = latest_value(index, dataset.id, dataset)
        if value is None or index.scope_of(value) is not index.scope_of(call):
            return False
        dataset = value
    if not isinstance(dataset, ast.Call):
        return False
    q = index.resolve(dataset.func) or dotted(dataset.func) or ""
    short = q.rsplit(".", 1)[-1]
    # a Dataset class constructed on the spot (`ModelNet40SVM(partition="train")`, `datasets.MNIST(...)`), not a
    # view of one built earlier (`Subset(ds, idx)`, `TensorDataset(x, y)` of tensors in memory)
    return short[:1].isupper() and short not in ("Subset", "TensorDataset", "ConcatDataset")


def _reused_within(index: Index, call: ast.Call, loop: Loop) -> bool:
    """The loader is built per fold, per run or per stage and then iterated over several epochs inside `loop`
    (`for train_set in folds: loader = DataLoader(train_set); for epoch ...: for x in loader`), or it is built
    from what the loop hands out (the fold's dataset): a new loader is the point."""
    varying = _varying_names(loop)
    if varying and any(isinstance(n, ast.Name) and n.id in varying for n in subtree(call)):
        return True
    name = _loader_name(index, call)
    todo = list(loop.children)
    while todo:
        child = todo.pop()
        todo += child.children
        if child.source == name:
            up = child.parent
            while up is not None and up is not loop:
                if up.trains:
                    return True  # an epoch loop between: the loader lives across its epochs
                up = up.parent
    return False


def _varying_names(loop: Loop) -> set[str]:
    """The loop's targets and the names assigned in its body from them, transitively: minimind builds
    `skip = start_step if epoch == start_epoch else 0; batch_sampler = SkipBatchSampler(indices, bs, skip)`
    each epoch and hands it to the loader, which therefore differs from one epoch to the next. Also names
    bound to a fresh random draw there (`indices = torch.randperm(n).tolist()`): a new order per epoch."""
    varying = set(loop.targets)
    assigns = [n for n in subtree(loop.node) if isinstance(n, ast.Assign)]
    changed = True
    while changed:
        changed = False
        for stmt in assigns:
            used = {n.id for n in subtree(stmt.value) if isinstance(n, ast.Name)}
            fresh = any(isinstance(n, ast.Attribute) and n.attr in _RANDOM_DRAWS for n in subtree(stmt.value))
            if not (used & varying or fresh):
                continue
            for target in stmt.targets:
                for n in subtree(target):
                    if isinstance(n, ast.Name) and n.id not in varying:
                        varying.add(n.id)
                        changed = True
    return varying


_RANDOM_DRAWS = frozenset(("randperm", "permutation", "shuffle", "choice", "sample"))


def _rebuild_cost(index: Index, call: ast.Call) -> str:
    if _dataset_built_here(index, call) and not _dataset_built_before_the_loop(index, call):
        return "its dataset is constructed again (files listed and read) and its workers restarted"
    return "its worker processes are started again and each gets a fresh copy of the dataset"


def _dataset_built_before_the_loop(index: Index, call: ast.Call) -> bool:
    """`dataset = VocoderDataset(...)` once, then `DataLoader(dataset, ...)` inside the epoch loop (Real-Time-Voice-
    Cloning's vocoder/train.py): the loader and its workers are rebuilt, the dataset is not."""
    dataset = kwarg(call, "dataset", 0)
    loops = index.loops_around(call)
    if not isinstance(dataset, ast.Name) or not loops:
        return False
    value = latest_value(index, dataset.id, dataset)
    loop = loops[0].node  # the loop whose every pass builds the loader
    return value is not None and not (loop.lineno <= value.lineno <= (loop.end_lineno or loop.lineno))


def _runs_whole_training(index: Index, fn: ast.AST) -> bool:
    """The function has its own epoch loop over the loaders it builds (`def patch_attack(...): loader = ...;
    for epoch in range(n): for x in loader: ... optimizer.step()`): each call is a complete run, so a loop
    calling it is a sweep over runs (uvadlc's patch sizes), not a loop over epochs."""
    return any(lp.trains and lp.parent is None and lp.kind != "batch" and index.function_of(lp.node) is fn
               and any(inner.trains for inner in index.loops.values() if inner.parent is lp)
               for lp in index.loops.values())


def _rebuilt_in(index: Index, call: ast.Call) -> Loop | None:
    """The training loop on whose every pass `call` runs: an enclosing loop that trains, or the loop around a
    call of the function holding it (one level), with no per-epoch condition between."""
    for loop in index.loops_around(call):
        if loop.trains:
            if index.guarded_in_loop(call, loop, rare=True) or _reused_within(index, call, loop):
                return None
            return loop
    if index.loops_around(call):
        return None  # inside a loop that does not train (over datasets, folds, configurations)
    fn = index.function_of(call)
    if fn is None or index.guarded_in_function(call) or _runs_whole_training(index, fn):
        return None
    shaped_by = set(_params_shaping(index, fn, call)) if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) else set()
    for caller in index.callers(fn):
        for loop in index.loops_around(caller):
            if loop.trains:
                if not index.guarded_in_loop(caller, loop, rare=True) \
                        and not shaped_by & set(_varying_arguments(caller, loop)):
                    return loop
                break
    return None


@rule("TD502", ast.Module)
def pin_memory_unset(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for b, _loop in _gpu_training_loaders(ctx):
        workers = loader_arg(b, "num_workers")
        if workers is None or is_constant(workers, 0):
            continue  # TD501's case: workers first
        if loader_arg(b, "pin_memory") is not None:
            continue  # set either way: the user chose
        if _on_device_dataset(index, loader_arg(b, "dataset")):
            continue
        ctx.report(b.call, variable=b.name)


def _iterated_per_epoch(index: Index, loop: Loop) -> bool:
    """The loop over the loader runs once per iteration of an outer (epoch) loop, directly or through
    a function called there; not an evaluation called every N steps from inside a batch loop."""
    if loop.parent is not None:
        return loop.parent.kind != "batch"
    fn = index.function_of(loop.node)
    if fn is None:
        return False
    outer = [index.loop_of(c) for c in index.callers(fn)]
    return any(o is not None and o.kind != "batch" for o in outer)


@rule("TD503", ast.Module)
def persistent_workers_unset(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    reported: set[int] = set()
    for loop, loaders in _loader_loops(ctx):
        if not _iterated_per_epoch(index, loop):
            continue
        for b in loaders:
            if id(b.call) in reported or b.star_kwargs:
                continue
            workers = loader_arg(b, "num_workers")
            if not _positive_int(workers) or b.arg("persistent_workers") is not None:
                continue
            reported.add(id(b.call))
            ctx.report(b.call, variable=b.name, workers=workers.value)  # type: ignore[union-attr]


def _non_blocking(call: ast.Call) -> bool:
    if any(kw.arg in ("non_blocking", None) for kw in call.keywords):
        return True  # set either way (or passed through **kwargs)
    return any(is_constant(a, True) for a in call.args)


@rule("TD504", ast.Module)
def blocking_copy_from_pinned_loader(node: ast.Module, ctx: Context) -> None:
    loader_loops = _loader_loops(ctx)
    if not loader_loops or not names_a_gpu(ctx.source):
        return
    index = ctx.index
    for loop, loaders in loader_loops:
        if not all(is_constant(loader_arg(b, "pin_memory"), True) for b in loaders):
            continue
        for call in batch_copies(index, loop):
            if not _non_blocking(call):
                ctx.report(call, variable=snippet(ctx, call, 50), loader=loaders[0].name)


def _under_any_condition(index: Index, node: ast.AST, loop: Loop) -> bool:
    """Whether `node` sits under any `if`/`try` between itself and the loop: for work that is usually done once
    behind a flag or a first-call check on a counter kept elsewhere (`if self.niter == 1: compile`)."""
    for anc in index.ancestors(node):
        if anc is loop.node:
            return False
        if isinstance(anc, ast.If | ast.IfExp | ast.Try | ast.ExceptHandler | ast.Assert | ast.While):
            return True
    return False


def _conditional_within(index: Index, node: ast.AST, loop: Loop) -> bool:
    """Whether some iterations of the loop skip `node`: a guard between them whose test changes from one
    iteration to the next (`if step % k == 0`, `if i == 0`), or an opt-in diagnostics switch (`if args.verbose`,
    `if debug`) that normal runs leave off. A branch on another fixed setting (`if args.loss == 'r1'`, `if
    self.use_amp`) runs on every iteration once taken, so it guards nothing. When the loop is itself nested in an
    outer training loop, a guard around the inner loop (`if step % policy_freq == 0: for _ in ...`) counts too."""
    if index.guarded_in_loop(node, loop) or _under_diagnostics_flag(index, node, loop):
        return True
    outer = loop.parent
    while outer is not None:
        if (outer.has_backward or outer.has_step) and index.guarded_in_loop(loop.node, outer):
            return True
        outer = outer.parent
    return False


_DIAGNOSTICS_FLAG = re.compile(r"(?:^|_)(?:verbose|debug|debugging|profile|profiling)(?:$|_)", re.IGNORECASE)


def _under_diagnostics_flag(index: Index, node: ast.AST, loop: Loop) -> bool:
    for anc in index.ancestors(node):
        if anc is loop.node:
            return False
        if isinstance(anc, ast.If) and any(
            isinstance(n, ast.Name | ast.Attribute) and _DIAGNOSTICS_FLAG.search(n.id if isinstance(n, ast.Name) else n.attr)
            for n in subtree(anc.test)
        ):
            return True
    return False


@rule("TD505", ast.Module)
def compile_in_training_loop(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in index.calls_to(*sorted(index.names["compile"])):
        _compile_in_training_loop(call, ctx)


def _compile_in_training_loop(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    loop = index.training_loop_of(node)
    if loop is None or _under_any_condition(index, node, loop):
        return  # `if epoch == warmup: model = torch.compile(model)` runs once
    target = kwarg(node, "model", 0)
    where = f"the loop over `{loop.source}`" if loop.source else f"the training loop at line {loop.line}"
    ctx.report(node, variable=snippet(ctx, node, 50), target_expr=snippet(ctx, target, 30) if target is not None else "model", loop=where)


_TIMER_NAME = re.compile(r"timer|stopwatch", re.I)
# A function (or file) whose purpose is measuring.
_MEASURING = re.compile(r"bench|profil|timing|measure|speed|(?:^|_)time(?:_|$)", re.I)


def _timed(index: Index, loop: Loop, fn: ast.AST | None) -> str | None:
    """How the loop (or its function) measures: "benchmark" for code whose purpose is measuring (a profiler, a
    memory figure, a function named for benchmarking), where synchronising is the point; "timer" for a training
    loop that times its own steps (a clock, CUDA events, a timer object), where the synchronisation makes the
    figure right but still costs every step; None when nothing is measured."""
    if fn is not None and _MEASURING.search(getattr(fn, "name", "")):
        return "benchmark"  # `benchmark_step`, pycls's `compute_time_train`
    for anc in index.ancestors(loop.node):
        if isinstance(anc, ast.With | ast.AsyncWith):
            for item in anc.items:
                expr = item.context_expr
                q = index.callee(expr) if isinstance(expr, ast.Call) else index.resolve(expr)
                if (q or "").startswith(_PROFILERS) and "Event" not in (q or "") or \
                        "profil" in (dotted(expr) or "").lower():
                    return "benchmark"
    found = None
    for call in loop.all_calls():
        q = index.callee(call) or ""
        if q.startswith(("torch.cuda.max_memory", "torch.cuda.memory_", "torch.cuda.reset_peak_memory")):
            return "benchmark"  # measuring memory: the synchronisation makes the figure exact
        if q.startswith(_PROFILERS) and not q.startswith("torch.cuda.Event"):
            return "benchmark"
        if q in _TIMERS or q.startswith("torch.cuda.Event"):
            found = "timer"
        elif isinstance(call.func, ast.Attribute) and call.func.attr == "record_function":
            return "benchmark"
        elif isinstance(call.func, ast.Attribute) and call.func.attr == "elapsed_time":
            found = "timer"
        elif isinstance(call.func, ast.Attribute) and (call.func.attr in ("tic", "toc") or _TIMER_NAME.search(
                last_name(call.func.value) or "")):
            found = "timer"  # `fw_timer.tic()` ... `torch.cuda.synchronize(); fw_timer.toc()` (pycls's benchmark)
    return found


@rule("TD506", ast.Module)
def synchronize_in_training_loop(node: ast.Module, ctx: Context) -> None:
    index = ctx.index
    for call in index.calls_to(*sorted(_SYNCHRONIZE)):
        _synchronize_in_training_loop(call, ctx)


def _synchronize_in_training_loop(node: ast.Call, ctx: Context) -> None:
    index = ctx.index
    loop = index.step_loop_of(node)
    if loop is None or _conditional_within(index, node, loop):
        return
    timed = _timed(index, loop, index.function_of(node))
    if timed == "timer" and _MEASURING.search(ctx.path.replace("\\", "/").rsplit("/", 1)[-1]):
        timed = "benchmark"  # benchmark.py, profile_step.py: measuring is the file's purpose
    if timed == "benchmark":
        return
    if timed == "timer" and not loop.trains:
        return  # a timed loop that does not train (a throughput test): measuring is its purpose
    if timed == "timer":
        # The figure is right only with the wait, but the training pays it every step (KPConv's trainer was about
        # 25% slower with it; torchtitan removed its per-step one): info, with the cheaper way to time.
        ctx.report(node, severity="info", variable=snippet(ctx, node, 40),
                   timing=" to time the step (it makes the timing exact, but training pays for it every step: "
                          "synchronise only on the steps you log, or read CUDA events a step later)")
        return
    ctx.report(node, variable=snippet(ctx, node, 40), timing="")


def _chained_into_sync(index: Index, node: ast.Call) -> bool:
    """`x.cpu()` in `x.cpu().numpy()`: the outer call reports the chain."""
    parent = index.parent(node)
    if isinstance(parent, ast.Attribute) and parent.attr in _SYNC_METHODS:
        grand = index.parent(parent)
        return isinstance(grand, ast.Call) and grand.func is parent
    return False


def _accumulated(index: Index, node: ast.AST, loop: Loop) -> bool:
    """The synced value goes into a running total or a history (`total += loss.item()`,
    `losses.append(loss.item())`, `meter.update(loss.item(), n)`)."""
    for anc in index.ancestors(node):
        if isinstance(anc, ast.AugAssign):
            return True
        if isinstance(anc, ast.Assign):
            targets = {dotted(t) for t in anc.targets}
            if any(dotted(n) in targets for n in subtree(anc.value) if isinstance(n, ast.Name | ast.Attribute)):
                return True  # total = total + loss.item()
            names = {n.id for t in anc.targets for n in subtree(t) if isinstance(n, ast.Name)}
            return bool(names) and _collected_later(loop, names)  # preds = out.cpu(); all_preds.append(preds)
        if isinstance(anc, ast.Call) and isinstance(anc.func, ast.Attribute) and anc.func.attr in _ACCUMULATE:
            return True
        if isinstance(anc, ast.stmt) or anc is loop.node:
            return False
    return False


def _collected_later(loop: Loop, names: set[str]) -> bool:
    """A name that the loop only adds to a running total or a history."""
    for sub in subtree(loop.node):
        if isinstance(sub, ast.AugAssign) and _mentions(sub.value, names):
            return True
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in _ACCUMULATE
            and any(_mentions(a, names) for a in sub.args)
        ):
            return True
    return False


def _feeds_a_branch(index: Index, node: ast.AST, loop: Loop) -> bool:
    """`value = loss.item()` then `if not math.isfinite(value): ...`: the step decides on the value (also when the
    read sits in a comprehension: `reduced = {k: v.item() for k, v in d.items()}`, `if math.isnan(sum(...))`)."""
    stmt = index.statement_of(node)
    if not isinstance(stmt, ast.Assign):
        return False
    names = {n.id for t in stmt.targets for n in subtree(t) if isinstance(n, ast.Name)}
    if not names:
        return False
    for sub in subtree(loop.node):
        if isinstance(sub, ast.If | ast.While | ast.Assert | ast.IfExp) and _mentions(sub.test, names):
            return True
    return False


def _on_host(index: Index, expr: ast.AST, at: ast.AST) -> bool:
    """A value that is certainly not on the GPU: a raw batch straight from the loader (never moved),
    a numpy array, or a Python number."""
    root = expr
    while isinstance(root, ast.Attribute | ast.Subscript | ast.Call):
        if isinstance(root, ast.Call):
            q = index.callee(root) or ""
            if q.startswith(("numpy.", "np.", "math.")):
                return True
            root = root.func
        else:
            root = root.value
    if not isinstance(root, ast.Name):
        return False
    if index.resolve(root) is not None:
        return (index.resolve(root) or "").startswith(("numpy", "math"))
    loop = index.loop_of(at)
    values = index.definitions(root.id, at)
    if not values:
        return loop is not None and root.id in loop.targets
    value = values[-1]
    if isinstance(value, ast.Call):
        q = index.callee(value) or ""
        if q.startswith(("numpy.", "np.")):
            return True
        if isinstance(value.func, ast.Attribute) and value.func.attr in ("numpy", "tolist", "item", "cpu"):
            return True
    return False


def _tensor_value(index: Index, expr: ast.AST, at: ast.AST, names: set[str]) -> bool:
    """A name known to hold a tensor on the device: a loss, a model's output."""
    return holds_graph(index, expr, at, names, device_only=True)


@rule("TD507", ast.Module)
def host_sync_every_step(node: ast.Module, ctx: Context) -> None:
    _leave_host_reads_of_parameters(ctx)
    if names_a_gpu(ctx.source) or ctx.index.uses_accelerate():
        ctx.leave("gpu-source", True)
        leave_sites(ctx)  # what this file calls in other files runs on its GPU
    if not ctx.index.training_loops():
        return
    # A training loop in a file that names no GPU (`def train(model, loader, optimizer, device)` in engine.py) runs
    # on whatever device its caller picks: its findings wait for the project pass, which keeps them when another
    # file of the project puts work on a GPU.
    defer = not trains_on_gpu(ctx)
    index = ctx.index
    if not defer:
        _leave_tensors_handed_to_helpers(ctx)
    candidates = [c for m in sorted(_SYNC_METHODS) for c in index.method_calls(m)]
    candidates += index.calls_to(*sorted(_SYNC_BUILTINS))
    # One cause, one finding: the first host read after GPU work waits for it; the reads right after it find
    # nothing queued and wait for nothing. So each sync point of a step gets one finding, at the severity of its
    # first read (info when that is a running total), and none when a wait it does not report came first.
    reads: dict[int, tuple[Loop, list[tuple[tuple[int, int], ast.Call | None, dict[str, str]]]]] = {}
    for call in sorted(set(candidates), key=_position):
        found = _host_sync_every_step(call, ctx)
        if found is not None:
            loop, values = found
            reads.setdefault(id(loop), (loop, []))[1].append((_position(call), call if values else None, values))
    # An explicit `torch.cuda.synchronize()` in the step (timing code) waits itself: reads right after it find
    # nothing queued. It joins its step's sync points as a wait this rule does not report.
    for call in index.calls_to(*sorted(_SYNCHRONIZE)):
        loop = index.step_loop_of(call)
        if loop is not None and id(loop) in reads:
            reads[id(loop)][1].append((_position(call), None, {}))
    for loop, group in reads.values():
        group.sort(key=lambda item: item[0])
        work = _gpu_work(index, loop)
        point: list[tuple[tuple[int, int], ast.Call | None, dict[str, str]]] = []
        for item in group:
            if point and any(point[-1][0] < w < item[0] for w in work):  # GPU work queued since: a new wait
                _report_sync_point(ctx, point, defer)
                point = []
            point.append(item)
        if point:
            _report_sync_point(ctx, point, defer)


def _gpu_work(index: Index, loop: Loop) -> list[tuple[int, int]]:
    """Where the step queues GPU work between host reads: a model's forward, a backward, an optimizer step."""
    backward, steps = set(index.backward_calls), set(index.step_calls)
    return [_position(c) for c in loop.all_calls()
            if c in backward or c in steps or (isinstance(c.func, ast.Name | ast.Attribute) and index.is_model(c.func))]


def _report_sync_point(ctx: Context, point: list[tuple[tuple[int, int], ast.Call | None, dict[str, str]]],
                       defer: bool = False) -> None:
    """Reads with no GPU work queued between them wait once, at the first: one finding (at the first read's
    severity), or none when the first is a wait the rule does not report (a timing synchronize, a read whose value
    decides a branch)."""
    first = point[0]
    if first[1] is None:
        return
    if first[2].get("weak"):  # a read that may wait for nothing: the first read known to wait speaks for the point
        first = next((item for item in point if item[1] is not None and not item[2].get("weak")), first)
        point = point[point.index(first):]
    later = sum(1 for item in point if item[1] is not None) - 1
    values = dict(first[2])
    values.pop("weak", None)
    severity = values.pop("severity", None)
    if later:
        values["kind"] += f"; {later} more read{'s' if later > 1 else ''} right after it, which wait for nothing"
    if defer:
        node = first[1]
        entry = _entry_point(ctx.index, node)
        if entry is not None:  # a loop at module level runs on its own, on the CPU this file picks
            ctx.leave("TD507-if-gpu", {"line": node.lineno, "col": node.col_offset + 1, "values": values,
                                       "entry": entry})
        return
    ctx.report(first[1], severity=severity, **values)


# -- reads in helpers of other files, and the project's GPU -----------------------------------------------------


def _entry_point(index: Index, node: ast.AST) -> str | None:
    """What another file calls to run `node`: the module-level function holding it, or the class whose method
    does (its callers build the class, then call the method)."""
    entry = None
    for anc in index.ancestors(node):
        if isinstance(anc, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) \
                and isinstance(index.parent(anc), ast.Module):
            entry = anc.name
    return entry


def _leave_host_reads_of_parameters(ctx: Context) -> None:
    """For the project pass: a function or method that reads one of its parameters on the host (`self.sum +=
    float(value) * n` in an AverageMeter's `update`): a device tensor handed to it waits there."""
    index = ctx.index
    candidates = [c for m in sorted(_SYNC_METHODS) for c in index.method_calls(m)]
    candidates += index.calls_to("float", "int")
    for call in candidates:
        func = call.func
        if isinstance(func, ast.Attribute):
            if call.args or call.keywords:
                continue
            operand = func.value
        elif call.args and len(call.args) == 1:
            operand = call.args[0]
        else:
            continue
        operand = _undetached(operand)
        fn = index.function_of(call)
        if not isinstance(operand, ast.Name) or fn is None or index.loop_of(call) is not None:
            continue
        info = index.class_of(call)
        if info is not None and (info.is_module or index.parent(fn) is not info.node):
            continue  # a module's forward (its reads are TD805's), or a function nested in a method
        owner = index.parent(info.node if info is not None else fn)
        if not isinstance(owner, ast.Module):
            continue
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if info is not None and params and params[0] in ("self", "cls"):
            params = params[1:]
        if operand.id not in params:
            continue
        ctx.leave("reads-param-on-host", {"class": info.name if info is not None else None, "function": fn.name,
                                          "position": params.index(operand.id), "line": call.lineno,
                                          "col": call.col_offset + 1, "variable": snippet(ctx, call, 50)})


def _leave_tensors_handed_to_helpers(ctx: Context) -> None:
    """For the project pass: a step loop hands a device tensor (a loss, a model's output) to a function or an object
    of a class another file defines (`loss_meter.update(loss.detach(), n)`), on every step."""
    index = ctx.index
    for loop in index.training_loops():
        if not (loop.has_backward or loop.has_step):
            continue
        fn = index.function_of(loop.node)
        names = ctx.memo(("backward-names", fn), lambda fn=fn: backward_names(index, fn))
        for call in loop.calls:
            if not call.args or index.local_target(call) is not None or _conditional_within(index, call, loop):
                continue
            func = call.func
            if isinstance(func, ast.Attribute):
                built = index.instance_class_of(func.value, call)
                callee = index.resolve(built) if built is not None else None
                cls, name = callee, func.attr
            elif isinstance(func, ast.Name):
                callee, cls, name = index.resolve(func), None, func.id
            else:
                continue
            if callee is None or callee.split(".", 1)[0] in _LIBRARY_ROOTS:
                continue
            positions = [i for i, arg in enumerate(call.args)
                         if not isinstance(arg, ast.Starred) and _tensor_value(index, _undetached(arg), call, names)]
            if positions:
                where = f"the loop over `{loop.source}`" if loop.source else f"the training loop at line {loop.line}"
                ctx.leave("tensor-to-helper", {"callee": callee, "class": cls is not None, "function": name,
                                               "positions": positions, "line": call.lineno, "loop": where,
                                               "shown": snippet(ctx, call, 50)})


@project("TD507")
def host_sync_in_helpers_and_gpu_projects(project: Project) -> list[ProjectHit]:
    """Two reads a file cannot judge alone: a step loop of a file that names no GPU, kept when another file of the
    project puts work on one (engine.py's `train(model, loader, optimizer, device)`, called by main.py with
    `device = torch.device("cuda")`); and a read inside a helper of another file that the step loop hands a device
    tensor every step (meters.py's `float(value)`), reported at the read, where the wait happens."""
    hits: list[ProjectHit] = []
    gpu = {f.path for f, _ in project.facts("gpu-source")}
    deferred = list(project.facts("TD507-if-gpu")) if gpu else []
    if deferred:
        context = call_context(project)
        for f, fact in deferred:
            # kept when a file that puts work on a GPU calls the function (or builds the class) holding the loop
            # through an import of it (a bare `main()` of another file is some other `main`)
            if any(site.path in gpu and site.path != f.path and site.callee is not None
                   and any(g.path == f.path for g, _ in project.defining(site.callee))
                   for site in context.sites(f, fact["entry"])):
                hits.append(ProjectHit(f.path, fact["line"], fact["col"], dict(fact["values"])))
    reads: dict[tuple[str, str | None, str], list[tuple[object, dict]]] = {}
    for f, fact in project.facts("reads-param-on-host"):
        reads.setdefault((f.module, fact["class"], fact["function"]), []).append((f, fact))
    if not reads:
        return hits
    seen: set[tuple[str, int]] = set()
    for g, fact in project.facts("tensor-to-helper"):
        for owner, name in project.defining(fact["callee"]):
            key = (owner.module, name, fact["function"]) if fact["class"] else (owner.module, None, name)
            for f, read in reads.get(key, ()):
                if read["position"] not in fact["positions"] or (f.path, read["line"]) in seen:  # type: ignore[attr-defined]
                    continue
                seen.add((f.path, read["line"]))  # type: ignore[attr-defined]
                hits.append(ProjectHit(f.path, read["line"], read["col"], {  # type: ignore[attr-defined]
                    "variable": read["variable"], "loop": f"{fact['loop']} in {g.path}",
                    "kind": f"a read of the tensor that `{fact['shown']}` (line {fact['line']}) hands in on every "
                            "step; keep the running value on the device and read it once per log interval"}))
    return hits


def _host_sync_every_step(node: ast.Call, ctx: Context) -> tuple[Loop, dict[str, str]] | None:
    """(the step loop, the finding's values) for a per-step host read (with "severity": "info" for a running total
    or a history); (loop, {}) for a read that waits but is not reported (its value decides the step's control
    flow); None for anything else."""
    func = node.func
    if isinstance(func, ast.Attribute):
        if func.attr not in _SYNC_METHODS or node.args or node.keywords:
            return None
        kind = f".{func.attr}()"
    elif isinstance(func, ast.Name) and func.id in _SYNC_BUILTINS:
        if not node.args or node.keywords and func.id != "print":
            return None
        kind = f"{func.id}()"
    else:
        return None
    index = ctx.index
    loop = index.step_loop_of(node)
    if loop is None:
        return None
    if index.grad_disabled(node) and index.grad_disabled(loop.node):
        return None  # a loop that only looks like a step loop
    if _conditional_within(index, node, loop):
        return None
    decides = _feeds_a_branch(index, node, loop)  # a wait the step needs: not reported, but later reads find nothing
    synced_anyway = _accumulated(index, node, loop)  # exempt from a finding, but the step still waits here
    fn = index.function_of(node)
    names = ctx.memo(("backward-names", fn), lambda: backward_names(index, fn))
    if isinstance(func, ast.Attribute):
        if _chained_into_sync(index, node):
            return None
        receiver = func.value
        if func.attr == "cpu" and index.is_model(receiver):
            return None
        if _on_host(index, receiver, node):
            return None
        if func.attr in ("cpu", "tolist") and not _tensor_value(index, receiver, node, names) and not _derived_tensor(index, receiver, node, names):
            return None
        variable = snippet(ctx, node, 50)
    else:
        if func.id == "print":
            shown = [a for a in node.args if _printed_tensor(index, a, node, names)]
            if not shown:
                return None
            variable = snippet(ctx, node, 50)
            kind = "print() of a tensor"
        else:
            if not _tensor_value(index, _undetached(node.args[0]), node, names):
                return None
            variable = snippet(ctx, node, 50)
    if decides:
        return loop, {}
    where = f"the loop over `{loop.source}`" if loop.source else f"the training loop at line {loop.line}"
    read = func.value if isinstance(func, ast.Attribute) else node.args[0]
    while isinstance(read, ast.Subscript | ast.Attribute):
        read = read.value
    if isinstance(read, ast.Name) and unpacked_beside_the_loss_from_elsewhere(index, read, names):
        # Where that value lives is decided in another file: a wait we cannot vouch for. Info, and a read right after
        # it that surely waits is the one reported (`_report_sync_point`).
        return loop, {"variable": variable, "kind": kind, "loop": where, "severity": "info", "weak": "yes"}
    if synced_anyway:
        # A running total or a history still waits every step, but TD101 recommends exactly this over keeping the
        # graph, and the wait only costs much when steps are short: info, with the device-side fix in the message.
        kind = f"{kind} kept in a running total or history: one wait per step, which costs throughput when " \
               "steps are short (small models, fast GPUs); sum `loss.detach()` on the device instead"
        return loop, {"variable": variable, "kind": kind, "loop": where, "severity": "info"}
    return loop, {"variable": variable, "kind": kind, "loop": where}


def _undetached(expr: ast.expr) -> ast.expr:
    """`loss.detach()` -> `loss`: a detached copy is still on the device, and reading it still waits (ptgnn's
    `sum_epoch_loss += float(mb_loss.detach())`)."""
    while (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "detach"
           and not expr.args and not expr.keywords):
        expr = expr.func.value
    return expr


def _derived_tensor(index: Index, expr: ast.AST, at: ast.AST, names: set[str]) -> bool:
    """`(logits.argmax(1) == y).float()`, `model(x).softmax(-1)`: built from a model output or a loss."""
    for sub in subtree(expr):
        if isinstance(sub, ast.Name) and _tensor_value(index, sub, at, names):
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name | ast.Attribute) and index.is_model(sub.func):
            return True
    return False


def _printed_tensor(index: Index, arg: ast.AST, at: ast.AST, names: set[str]) -> bool:
    """A print argument that formats a device tensor (not its `.shape`, not an `.item()`, which
    reports itself)."""
    if isinstance(arg, ast.JoinedStr):
        return any(
            isinstance(v, ast.FormattedValue) and _printed_tensor(index, v.value, at, names) for v in arg.values
        )
    return isinstance(arg, ast.Name) and _tensor_value(index, arg, at, names)

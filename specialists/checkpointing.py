"""Checkpointing and reproducibility: complete checkpoints, safe loading, state_dict keys, determinism."""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, listing

SPECIALIST = Specialist("checkpointing")

# Everything here loads with torch.load's default weights_only=True: tensors,
# dicts, lists, numbers, strings and tuples of them (no numpy arrays).
_SAVE = """\
import os, random

def save_checkpoint(path, model, optimizer, scheduler, scaler, epoch, step):
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": epoch,
        "step": step,
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all(),
                "python": random.getstate()},
    }
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)   # atomic: a crash mid-save never leaves a truncated checkpoint"""

_RESUME = """\
ckpt = torch.load(path, map_location="cpu", weights_only=True)
model.load_state_dict(ckpt["model"])
optimizer.load_state_dict(ckpt["optimizer"])   # after the model is on its device
scheduler.load_state_dict(ckpt["scheduler"])
scaler.load_state_dict(ckpt["scaler"])
torch.set_rng_state(ckpt["rng"]["torch"])
torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
random.setstate(ckpt["rng"]["python"])
start_epoch = ckpt["epoch"] + 1"""

_WHAT_FOR = {
    "optimizer": "Adam's moment estimates restart from zero",
    "scheduler": "the learning rate jumps back to the start of its schedule",
    "scaler": "the loss scale restarts at 65536 and skips steps again",
    "epoch": "the run does not know where to continue",
    "step": "the run does not know where to continue",
    "rng": "data order and dropout masks differ from an uninterrupted run",
}


@SPECIALIST.handles("checkpoint-incomplete")
def incomplete(case: Case) -> Advice:
    missing = case.names("missing")
    saved = case.names("saved")
    where = case.at("The checkpoint")
    if missing:
        facts = f"{where} lacks {listing(missing, limit=6)}"
        if saved:
            facts += f" (it holds {listing(saved, limit=6)})"
        consequences = [_WHAT_FOR[m] for m in missing if m in _WHAT_FOR]
        facts += ": on resume " + "; ".join(dict.fromkeys(consequences)) + "." if consequences else "."
    else:
        facts = (
            f"{where} saves only part of the training state: a resume needs the optimizer, scheduler, scaler, "
            "epoch/step and RNG states as well as the weights."
        )
    return Advice(
        facts,
        [
            Fix(
                title="Save the whole training state, atomically",
                snippet=_SAVE,
                why="Resuming is only equivalent to not stopping when every stateful object comes back; writing to a "
                "temporary file and renaming it keeps the previous checkpoint intact if the job dies mid-save.",
                verify="Train N steps, save, resume, train M more: the loss matches an uninterrupted N+M run.",
                location=case.location,
            ),
            Fix(
                title="Resume every piece, in order",
                snippet=_RESUME,
                why="The optimizer's state tensors are moved to its parameters' device on load, so build and move "
                "the model first; map_location='cpu' avoids loading onto the GPU the file was saved from.",
                verify="optimizer.state_dict()['state'] is non-empty right after resuming; the LR equals the saved one.",
            ),
        ],
        [f"`{case.run_cmd(extra='--steps 20')}` records what each torch.save call actually holds."],
    )


def _prefix_of(missing: list[str], unexpected: list[str]) -> str | None:
    """The prefix every unexpected key has over a missing one ('module.', '_orig_mod.')."""
    for prefix in ("module.", "_orig_mod.", "model."):
        if unexpected and all(k.startswith(prefix) for k in unexpected):
            if not missing or {k[len(prefix):] for k in unexpected} & set(missing):
                return prefix
        if missing and all(k.startswith(prefix) for k in missing):
            if not unexpected or {k[len(prefix):] for k in missing} & set(unexpected):
                return "-" + prefix  # the model expects the prefix the checkpoint lacks
    return None


@SPECIALIST.handles("state-dict-mismatch", "wrapped-state-dict-saved")
def state_dict_mismatch(case: Case) -> Advice:
    missing = case.names("missing_keys")
    unexpected = case.names("unexpected_keys")
    prefix = case.text("prefix")
    if prefix is None:
        prefix = _prefix_of(missing, unexpected)
    reverse = prefix is not None and prefix.startswith("-")
    if reverse:
        prefix = prefix[1:]
    param = case.text("param")
    ckpt_shape, model_shape = case.text("checkpoint_shape"), case.text("model_shape")
    counts = []
    if missing:
        counts.append(f"{count(len(missing), 'missing key')} (e.g. `{missing[0]}`)")
    if unexpected:
        counts.append(f"{count(len(unexpected), 'unexpected key')} (e.g. `{unexpected[0]}`)")
    facts = "load_state_dict found " + " and ".join(counts) if counts else "The checkpoint's keys do not match the model's"
    if prefix == "module." and not reverse:
        facts += ": the checkpoint was saved from a DDP/DataParallel wrapper, so every key carries the `module.` prefix."
    elif prefix == "_orig_mod." and not reverse:
        facts += ": the checkpoint was saved from a torch.compile'd model, so every key carries the `_orig_mod.` prefix."
    elif prefix and reverse:
        facts += f": the model being loaded is wrapped (its keys start with `{prefix}`) but the checkpoint was saved unwrapped."
    elif prefix:
        facts += f": the keys differ by the `{prefix}` prefix."
    elif param and ckpt_shape and model_shape:
        facts = (
            f"`{param}` has shape {ckpt_shape} in the checkpoint but {model_shape} in the model: the layer was "
            "resized (e.g. a different number of classes or vocabulary size)."
        )
    else:
        facts += ": the architectures differ (renamed, added or resized layers), or the wrong checkpoint is loaded."
    fixes: list[Fix] = []
    if prefix:
        strip = prefix
        fixes.append(
            Fix(
                title=f"Load into the unwrapped model, or strip `{strip}` from the keys",
                snippet=(
                    "from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present\n"
                    "state = torch.load(path, map_location='cpu', weights_only=True)\n"
                    f"consume_prefix_in_state_dict_if_present(state, '{strip}')\n"
                    "model.load_state_dict(state)   # strict: every key must now match"
                    if not reverse
                    else "model.module.load_state_dict(state)   # load into the wrapped module, not the wrapper"
                ),
                why="The parameters are the same; only the names differ by the wrapper's attribute.",
                verify="load_state_dict(strict=True) returns no missing or unexpected keys.",
                location=case.location,
            )
        )
        fixes.append(
            Fix(
                title="Save the unwrapped module's state_dict from now on",
                snippet="raw = model.module if hasattr(model, 'module') else model   # DDP\n"
                "raw = getattr(raw, '_orig_mod', raw)                            # torch.compile\n"
                "torch.save(raw.state_dict(), path)",
                why="Checkpoints then load into a plain model, with or without DDP or compile.",
                verify="Keys in the saved file have no `module.` / `_orig_mod.` prefix.",
            )
        )
    else:
        fixes.append(
            Fix(
                title="Compare key sets and shapes to find the real difference",
                snippet=(
                    "state = torch.load(path, map_location='cpu', weights_only=True)\n"
                    "own = model.state_dict()\n"
                    "print('missing:', sorted(own.keys() - state.keys())[:10])\n"
                    "print('unexpected:', sorted(state.keys() - own.keys())[:10])\n"
                    "print('resized:', [k for k in own.keys() & state.keys() if own[k].shape != state[k].shape])"
                ),
                why="Renamed attributes show as missing+unexpected pairs; a new head shows as resized.",
                verify="The three lists explain every difference.",
                location=case.location,
            )
        )
        fixes.append(
            Fix(
                title="For fine-tuning, load the matching part deliberately",
                snippet=(
                    "own = model.state_dict()\n"
                    "keep = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}\n"
                    "result = model.load_state_dict(keep, strict=False)\n"
                    "print('left at init:', result.missing_keys)   # check it is only the new head"
                ),
                why="strict=False is safe only when you print and check what it skipped.",
                verify="result.missing_keys lists only the layers you replaced.",
                applies_when="The architecture differs on purpose (a new classification head).",
            )
        )
    return Advice(
        facts,
        fixes,
        [f"`{case.check_cmd(case.rule_code('TD7'))}` finds saves of wrapped models and strict=False loads."],
    )


@SPECIALIST.handles("unsafe-load")
def unsafe_load(case: Case) -> Advice:
    explicit_false = case.value("weights_only") is False
    no_map = case.value("map_location_missing") is True or "load-cuda-on-cpu" in case.sources
    unsupported = case.text("unsupported_global")
    where = case.at("torch.load")
    if explicit_false:
        facts = (
            f"{where} loads with weights_only=False: unpickling can run arbitrary code from the file."
        )
    else:
        facts = (
            f"{where} relies on torch.load's default: since PyTorch 2.6 that is weights_only=True, which loads "
            "tensors and plain containers but refuses checkpoints holding your own classes or numpy arrays."
        )
    if unsupported:
        facts = (
            f"{where} refused `{unsupported}`: weights_only=True (the default since PyTorch 2.6) loads tensors and "
            "plain containers only, and this checkpoint holds another type."
        )
    if no_map:
        facts += " Without map_location, tensors go back to the device they were saved from, which fails or crowds GPU 0 elsewhere."
    if "weights-only-failed" in case.sources:
        return _weights_only_failed(case, unsupported, where)
    return Advice(
        facts,
        [
            Fix(
                title="Load explicitly: weights_only=True and map_location",
                snippet="state = torch.load(path, map_location='cpu', weights_only=True)",
                why="Safe against malicious pickles; 'cpu' (or the local device) makes the file load anywhere.",
                verify="The load works on a machine with a different GPU count, and without a GPU.",
                location=case.location,
            ),
            Fix(
                title="Allow exactly the extra types your checkpoint holds",
                snippet=(
                    "print(torch.serialization.get_unsafe_globals_in_checkpoint(path))  # what weights_only rejects\n"
                    "torch.serialization.add_safe_globals([TrainConfig])               # your own, trusted classes\n"
                    "state = torch.load(path, map_location='cpu', weights_only=True)"
                ),
                why="A full training checkpoint that stores a config object or numpy values fails under "
                "weights_only=True; allow-listing those classes keeps the safe loader. Better still, store such "
                "values as tensors or plain Python types.",
                verify="The load succeeds without weights_only=False.",
                applies_when="A weights_only load fails with 'Unsupported global' for a class you wrote or trust.",
            ),
            Fix(
                title="weights_only=False only for files you produced yourself",
                snippet="state = torch.load(path, map_location='cpu', weights_only=False)  # trusted, self-made file only",
                why="It restores arbitrary pickled objects, which is also how a malicious file runs code.",
                verify="The file comes from your own training run or a source you trust.",
                applies_when="Never for downloaded or shared checkpoints.",
            ),
        ],
        [f"`{case.check_cmd(case.rule_code('TD7'))}` lists every torch.load and how it is called."],
    )


def _weights_only_failed(case: Case, unsupported: str | None, where: str) -> Advice:
    """A weights_only load already failed: repeating it is no fix. Allow-list the trusted class, or
    load a trusted file with weights_only=False."""
    cls = unsupported.rsplit(".", 1)[-1] if unsupported else None
    if unsupported:
        facts = (
            f"{where} failed with weights_only=True (the default since PyTorch 2.6): the checkpoint holds "
            f"`{unsupported}`, which is not a tensor or an allow-listed type."
        )
        module = unsupported.rsplit(".", 1)[0] if "." in unsupported else None
        allow = (
            (f"from {module} import {cls}\n" if module else "")
            + f"torch.serialization.add_safe_globals([{cls}])   # only a class you trust\n"
            "state = torch.load(path, map_location='cpu')\n\n"
            f"# or only around this load:\nwith torch.serialization.safe_globals([{cls}]):\n"
            "    state = torch.load(path, map_location='cpu')"
        )
    else:
        facts = (
            f"{where} failed with weights_only=True (the default since PyTorch 2.6): the file holds objects the "
            "safe loader refuses, or is not a PyTorch checkpoint at all (a truncated download, an HTML page or a "
            "Git LFS pointer also fails this way)."
        )
        allow = (
            "print(torch.serialization.get_unsafe_globals_in_checkpoint(path))  # what the safe loader refuses\n"
            "torch.serialization.add_safe_globals([TrainConfig])                # each class you trust\n"
            "state = torch.load(path, map_location='cpu')"
        )
    fixes = [
            Fix(
                title=f"Allow-list {f'`{cls}`' if cls else 'the classes the checkpoint holds'} and keep the safe loader",
                snippet=allow,
                why="add_safe_globals (or the safe_globals context manager) lets weights_only=True rebuild exactly the "
                "types you name, and nothing else.",
                verify="torch.load succeeds without weights_only=False.",
                location=case.location,
            ),
            Fix(
                title="weights_only=False, only for a file you trust",
                snippet="state = torch.load(path, map_location='cpu', weights_only=False)  # your own or a trusted file only",
                why="It unpickles arbitrary objects, which is also how a malicious checkpoint runs code.",
                verify="The file comes from your own training run or a source you trust.",
                applies_when="Never for downloaded or shared checkpoints you cannot vouch for.",
            ),
    ]
    if cls is None:  # no class named: the file itself may not be a checkpoint
        fixes.append(
            Fix(
                title="Check that the file is a checkpoint",
                snippet="import os, zipfile\nprint(os.path.getsize(path), zipfile.is_zipfile(path))  # a torch.save file is a zip",
                why="'Unsupported operand' or a tiny file usually means an incomplete download or a Git LFS pointer.",
                verify="The size matches the published file and is_zipfile is True.",
            )
        )
    return Advice(facts, fixes, [f"`{case.check_cmd(case.rule_code('TD7'))}` lists every torch.load and how it is called."])


@SPECIALIST.handles("whole-model-pickled")
def whole_model(case: Case) -> Advice:
    where = case.at("torch.save")
    facts = (
        f"{where} pickles the whole model object: loading it needs weights_only=False (arbitrary code) and the exact "
        "class at the same import path, so a refactor or a moved file breaks old checkpoints."
    )
    attr, module = case.text("attribute"), case.text("module")
    if attr and module:
        facts = (
            f"Loading failed because `{module}` no longer has `{attr}`: the checkpoint pickled a whole object, and "
            "unpickling needs its class at the exact import path it was saved from."
        )
    return Advice(
        facts,
        [
            Fix(
                title="Save the state_dict; rebuild the model from code",
                snippet="torch.save(model.state_dict(), path)\n\n"
                "model = Net(**config)\nmodel.load_state_dict(torch.load(path, map_location='cpu', weights_only=True))",
                why="A state_dict is tensors keyed by name: loadable safely, and independent of the class's module path.",
                verify="The checkpoint loads with weights_only=True in a fresh process.",
                location=case.location,
            ),
        ],
        [f"`{case.check_cmd(case.rule_code('TD7'))}` finds torch.save calls on module objects."],
    )


_SEED = """\
import random
import numpy as np

def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)            # also seeds every CUDA device
    g = torch.Generator()
    g.manual_seed(seed)
    return g

def seed_worker(worker_id):
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)

g = seed_everything(0)
loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4,
                    worker_init_fn=seed_worker, generator=g)"""


@SPECIALIST.handles("nondeterminism")
def nondeterminism(case: Case) -> Advice:
    op = case.text("op")
    facts = "Results differ from run to run"
    if op:
        facts = f"`{op}` has no deterministic implementation, and deterministic algorithms were requested"
    elif "deterministic-cublas" in case.sources:
        facts = "Deterministic algorithms are on but CUBLAS_WORKSPACE_CONFIG is not set, so cuBLAS matmuls may differ run to run"
    facts += (
        ": unseeded randomness (Python, numpy, DataLoader workers) or non-deterministic kernels "
        "(atomics in scatter/index_add backward, cuDNN autotuning) are the usual sources."
    )
    return Advice(
        facts,
        [
            Fix(
                title="Seed every random source, including DataLoader workers",
                snippet=_SEED,
                why="Each worker has its own numpy/random state; the generator fixes the shuffle order.",
                verify="Two runs on the same machine give identical losses for the first steps.",
                location=case.location,
            ),
            Fix(
                title="Require deterministic kernels",
                snippet=(
                    "import os\n"
                    "os.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'   # before the first cuBLAS call\n"
                    "torch.use_deterministic_algorithms(True)          # raises on ops without a deterministic version\n"
                    "torch.backends.cudnn.benchmark = False"
                ),
                why="Some CUDA kernels (atomics) sum in varying order; deterministic mode picks reproducible ones or "
                "raises naming the op. cuBLAS needs the workspace setting for reproducible matmuls.",
                verify="Two runs give bit-identical losses; an op without a deterministic kernel raises a RuntimeError naming it.",
                applies_when="Costs some speed; exact reproducibility holds on the same hardware and software versions only.",
            ),
        ],
        [f"`{case.run_cmd('env')}` reports determinism flags, cudnn.benchmark and the relevant environment variables."],
    )


@SPECIALIST.handles("checkpoint-corrupt")
def corrupt(case: Case) -> Advice:
    key = case.text("key")
    reason = case.text("reason")
    facts = "The file is not a readable PyTorch checkpoint"
    if key == "v":
        facts = "The file starts with 'v': it is most likely a Git LFS pointer ('version https://git-lfs...'), not the checkpoint"
    elif key == "<":
        facts = "The file starts with '<': it is an HTML page (a failed or login-walled download), not the checkpoint"
    elif reason:
        facts += f" ({reason}): it was truncated while being written or copied"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="Check what the file actually is",
                snippet="head -c 200 checkpoint.pt | xxd | head   # a real checkpoint is a zip: it starts with 'PK'",
                why="Pointer files, HTML error pages and truncated copies all fail torch.load with confusing messages.",
                verify="The file starts with PK and its size matches the original.",
            ),
            Fix(
                title="Write checkpoints atomically",
                snippet="tmp = path + '.tmp'\ntorch.save(state, tmp)\nos.replace(tmp, path)",
                why="A job killed mid-save leaves a truncated file under the real name; a rename is all-or-nothing.",
                verify="After killing a run during a save, the previous checkpoint still loads.",
                location=case.location,
            ),
            Fix(
                title="Fetch the real file behind an LFS pointer",
                snippet="git lfs install\ngit lfs pull",
                why="A clone without git-lfs checks out small text pointers in place of large files.",
                verify="The file size is the model's size, not ~130 bytes.",
                applies_when="The checkpoint comes from a git repository that uses Git LFS.",
            ),
        ],
        [f"`{case.check_cmd('TD7')}` checks how checkpoints are written and loaded."],
    )


@SPECIALIST.handles("checkpoint-setup")
def checkpoint_setup(case: Case) -> Advice:
    return Advice(
        "A checkpoint you can resume from holds the model, optimizer, scheduler and scaler state, the epoch/step "
        "and the RNG states; save it atomically and load it with weights_only=True and map_location.",
        [
            Fix(
                title="Save the whole training state, atomically",
                snippet=_SAVE,
                why="Weights alone give a model to evaluate, not a run to continue.",
                verify="Resume after N steps and compare with an uninterrupted run: the losses match.",
            ),
            Fix(
                title="Resume every piece, in order",
                snippet=_RESUME,
                why="Loading the optimizer before the model is on its device, or forgetting the scheduler, silently "
                "changes the run.",
                verify="The learning rate and step counter after resuming equal the saved ones.",
            ),
            Fix(
                title="For weights you publish, save the state_dict alone",
                snippet="torch.save(model.state_dict(), 'model.pt')",
                why="A plain state_dict loads with weights_only=True anywhere, independent of your training code.",
                verify="torch.load('model.pt', weights_only=True) works in a fresh process.",
            ),
        ],
        [f"`{case.check_cmd('TD7')}` checks every torch.save and torch.load call."],
    )


@SPECIALIST.handles("save-on-all-ranks")
def save_all_ranks(case: Case) -> Advice:
    where = case.at("The checkpoint code")
    return Advice(
        f"From the checkpoint side: {where[:1].lower() + where[1:]} writes from every rank; with DDP one rank's "
        "state is the whole state.",
        [
            Fix(
                title="Write on rank 0 only, then barrier",
                snippet="if dist.get_rank() == 0:\n    torch.save(state, path)\ndist.barrier()",
                why="Replicas are identical; one writer avoids torn files.",
                verify="One checkpoint file per save; it loads with weights_only=True.",
                location=case.location,
            ),
            Fix(
                title="Sharded models: save with torch.distributed.checkpoint, from every rank",
                snippet="import torch.distributed.checkpoint as dcp\ndcp.save({'model': model.state_dict()}, checkpoint_id=ckpt_dir)",
                why="With FSDP each rank holds a different shard, so every rank must write its part; DCP coordinates it.",
                verify="dcp.load restores the model on the same or a different number of ranks.",
                applies_when="FSDP / tensor-parallel models only; for DDP save on rank 0.",
            ),
        ],
        [f"`{case.check_cmd(case.rule_code('TD3'))}` checks that saves are guarded by a rank check."],
    )


def _state_lost(optimizer: str | None) -> str:
    """What a fresh optimizer of this class starts without, in words."""
    if optimizer is None:
        return "Adam's moments and step count (SGD's momentum)"
    if "adam" in optimizer.lower():
        return f"{optimizer}'s moment estimates and step count"
    if optimizer == "SGD":
        return "SGD's momentum buffers"
    return f"{optimizer}'s per-parameter state"


@SPECIALIST.handles("resume-optimizer-state-missing")
def resume_optimizer_missing(case: Case) -> Advice:
    how = case.text("how")
    where = case.at("The resume code")
    if how == "replaced":
        facts = (f"{where} builds a new optimizer after the checkpoint's optimizer state was loaded into another "
                 "one: the optimizer that steps starts empty.")
    else:
        facts = (f"{where} restores the weights from a checkpoint that also holds optimizer state, which is never "
                 "loaded: the optimizer that steps starts empty.")
    optimizer = case.text("stepping_optimizer")  # measured: the class of the optimizer that stepped
    facts += f" {_state_lost(optimizer)} restart, so the first updates after the resume differ."
    built = optimizer if optimizer and optimizer.isidentifier() else "AdamW"
    return Advice(
        facts,
        [
            Fix(
                title="Build the optimizer once, then load its state into that same object",
                snippet=(
                    f"optimizer = torch.optim.{built}(model.parameters(), lr=lr)\n"
                    "if checkpoint is not None:\n"
                    "    model.load_state_dict(checkpoint['model'])\n"
                    "    optimizer.load_state_dict(checkpoint['optimizer'])\n"
                    "# no second optimizer after this point"
                ),
                why="load_state_dict fills the object it is called on; an optimizer built afterwards knows nothing "
                "of it.",
                verify="`len(optimizer.state)` is non-zero before the first step after the resume.",
                location=case.location,
            )
        ],
        [f"`{case.run_cmd('checkpoint')}` records what each load restored."],
    )


@SPECIALIST.general
def general(case: Case) -> Advice:
    symptom = case.symptom.title[:1].lower() + case.symptom.title[1:]
    return Advice(
        f"From the checkpointing side of {symptom}: make the run resumable and reproducible so the problem can be "
        "replayed from the step before it appears.",
        [
            Fix(
                title="Save the whole training state, atomically",
                snippet=_SAVE,
                why="A complete checkpoint just before the failing step lets you replay it in seconds.",
                verify="Resuming from the checkpoint reproduces the same loss at the next step.",
            )
        ],
        [f"`{case.check_cmd('TD7')}` checks every torch.save and torch.load call."],
    )

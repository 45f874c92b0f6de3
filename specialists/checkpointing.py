"""Checkpointing and reproducibility: complete checkpoints, safe loading, state_dict keys, determinism.

The fixes themselves are data (rules/data/advice/checkpointing.toml); this module decides which
apply, in which order, and which line each is pinned to.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, listing

SPECIALIST = Specialist("checkpointing")


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
            advice.fix("checkpointing", "save-full-state", location=case.location),
            advice.fix("checkpointing", "resume-in-order"),
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
            advice.fix("checkpointing", "strip-prefix", location=case.location, strip=strip)
            if not reverse
            # the model is wrapped, the checkpoint is not: the wrapper's attribute holds the module to load into
            else advice.fix("checkpointing", "load-into-wrapped", location=case.location, strip=strip,
                            attribute=strip.rstrip("."))
        )
        fixes.append(advice.fix("checkpointing", "save-unwrapped"))
    else:
        fixes.append(advice.fix("checkpointing", "compare-keys", location=case.location))
        fixes.append(advice.fix("checkpointing", "load-matching-part"))
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
            advice.fix("checkpointing", "explicit-safe-load", location=case.location),
            advice.fix("checkpointing", "allow-listed-types"),
            advice.fix("checkpointing", "weights-only-false-own-files"),
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
            advice.fix("checkpointing", "allow-list-class", location=case.location, cls=cls, module=module)
            if module
            else advice.fix("checkpointing", "allow-list-unqualified-class", location=case.location, cls=cls)
        )
    else:
        facts = (
            f"{where} failed with weights_only=True (the default since PyTorch 2.6): the file holds objects the "
            "safe loader refuses, or is not a PyTorch checkpoint at all (a truncated download, an HTML page or a "
            "Git LFS pointer also fails this way)."
        )
        allow = advice.fix("checkpointing", "allow-list-unknown-classes", location=case.location)
    fixes = [
        allow,
        advice.fix("checkpointing", "weights-only-false-trusted"),
    ]
    if cls is None:  # no class named: the file itself may not be a checkpoint
        fixes.append(advice.fix("checkpointing", "check-file-is-checkpoint"))
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
            advice.fix("checkpointing", "save-state-dict", location=case.location),
        ],
        [f"`{case.check_cmd(case.rule_code('TD7'))}` finds torch.save calls on module objects."],
    )


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
            advice.fix("checkpointing", "seed-everything", location=case.location),
            advice.fix("checkpointing", "deterministic-kernels"),
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
            advice.fix("checkpointing", "inspect-file"),
            advice.fix("checkpointing", "atomic-write", location=case.location),
            advice.fix("checkpointing", "git-lfs-pull"),
        ],
        [f"`{case.check_cmd('TD7')}` checks how checkpoints are written and loaded."],
    )


@SPECIALIST.handles("checkpoint-setup")
def checkpoint_setup(case: Case) -> Advice:
    return Advice(
        "A checkpoint you can resume from holds the model, optimizer, scheduler and scaler state, the epoch/step "
        "and the RNG states; save it atomically and load it with weights_only=True and map_location.",
        [
            advice.fix("checkpointing", "save-full-state-setup"),
            advice.fix("checkpointing", "resume-in-order-setup"),
            advice.fix("checkpointing", "publish-state-dict"),
        ],
        [f"`{case.check_cmd('TD7')}` checks every torch.save and torch.load call."],
    )


@SPECIALIST.handles("save-on-all-ranks")
def save_all_ranks(case: Case) -> Advice:
    where = case.at("The checkpoint code")
    return Advice(
        f"From the checkpoint side: {where[:1].lower() + where[1:]} writes from {case.text('runs_on') or 'every rank'}; "
        "with DDP one rank's state is the whole state.",
        [
            advice.fix("checkpointing", "save-on-rank-zero", location=case.location),
            advice.fix("checkpointing", "distributed-checkpoint"),
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
    if how in ("scheduler-fresh", "scheduler-stale"):
        return _resume_scheduler_missing(case, how, where)
    if how == "scaler-replaced":
        return Advice(
            f"{where} builds a new GradScaler after the checkpoint's scaler state was loaded into another one: the "
            "continued run starts again from the initial loss scale and skips the steps that overflow on the way "
            "back down.",
            [advice.fix("checkpointing", "keep-restored-scaler", location=case.location)],
            [f"`{case.run_cmd('checkpoint')}` records what each load restored."],
        )
    if how == "replaced":
        facts = (f"{where} builds a new optimizer after the checkpoint's optimizer state was loaded into another "
                 "one: the optimizer that steps starts empty.")
    elif how == "unrestored":
        facts = (f"{where} reads a checkpoint of the layout this run writes itself before training, but no optimizer "
                 "state is restored from it (a restore called before the optimizer it should fill is built or "
                 "registered): the optimizer that steps starts empty.")
    elif how == "loaded-empty":
        facts = (f"{where} calls the optimizer's load_state_dict with a state dict that holds no per-parameter "
                 "state (one built from the fresh optimizer's own state_dict(), empty before its first step), while "
                 "the checkpoint holds that state: the optimizer that steps starts empty.")
    else:
        facts = (f"{where} restores the weights from a checkpoint that also holds optimizer state, which is never "
                 "loaded: the optimizer that steps starts empty.")
    optimizer = case.text("stepping_optimizer")  # measured: the class of the optimizer that stepped
    facts += f" {_state_lost(optimizer)} restart, so the first updates after the resume differ."
    built = optimizer if optimizer and optimizer.isidentifier() else "AdamW"
    return Advice(
        facts,
        [
            advice.fix("checkpointing", "load-into-stepping-optimizer", location=case.location, built=built)
        ],
        [f"`{case.run_cmd('checkpoint')}` records what each load restored."],
    )


def _resume_scheduler_missing(case: Case, how: str, where: str) -> Advice:
    """The optimizer came back but its schedule did not: counted again from zero, or driving a pickled copy."""
    scheduler = case.text("scheduler") or "the scheduler"
    if how == "scheduler-stale":
        facts = (f"{where} restores {scheduler}, whose state holds another scheduler object bound to a copy of the "
                 "optimizer pickled with it: after the resume the schedule moves the copy's learning rate, and the "
                 "optimizer that steps keeps the learning rate it was saved with.")
        fixes = [advice.fix("checkpointing", "restore-nested-scheduler", location=case.location)]
    else:
        facts = (f"{where} restores the optimizer's state but not {scheduler}'s: its step count starts again at zero, "
                 "so every milestone, warm-up and decay after the resume comes as many steps late as the checkpoint "
                 "had taken.")
        fixes = [advice.fix("checkpointing", "resume-in-order", location=case.location),
                 advice.fix("checkpointing", "save-full-state")]
    return Advice(facts, fixes, [f"`{case.run_cmd('checkpoint')}` records what each load restored."])


@SPECIALIST.general
def general(case: Case) -> Advice:
    symptom = case.symptom.title[:1].lower() + case.symptom.title[1:]
    return Advice(
        f"From the checkpointing side of {symptom}: make the run resumable and reproducible so the problem can be "
        "replayed from the step before it appears.",
        [
            advice.fix("checkpointing", "save-full-state-to-replay")
        ],
        [f"`{case.check_cmd('TD7')}` checks every torch.save and torch.load call."],
    )

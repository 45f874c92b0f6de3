"""Tensor operations and memory: OOM, leaks, peaks, fragmentation, host RAM.

The fixes themselves are data (rules/data/advice/memory.toml); this module decides which apply,
in which order, and which line each is pinned to.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, gib, mib

SPECIALIST = Specialist("memory")


def _fragmentation_fix(case: Case) -> Fix:
    return advice.fix("memory", "expandable-segments", script=case.script)


def _checkpointing_fix() -> Fix:
    return advice.fix("memory", "activation-checkpointing")


def _bf16_fix() -> Fix:
    return advice.fix("memory", "bf16-autocast")


def _accumulation_fix() -> Fix:
    return advice.fix("memory", "gradient-accumulation")


def _optimizer_state_fix() -> Fix:
    return advice.fix("memory", "shrink-optimizer-state")


def _inference_fix(case: Case | None = None) -> Fix:
    return advice.fix("memory", "inference-mode-validation", location=case.location if case is not None else None)


@SPECIALIST.handles("oom")
def out_of_memory(case: Case) -> Advice:
    requested = case.num("requested_gib")
    total = case.num("total_gib")
    free = case.num("free_gib")
    reserved_free = case.num("reserved_unallocated_gib")
    allocated = case.num("allocated_gib")
    peak = case.num("peak_gib")
    numbers = ""
    if total is None and case.num("max_allowed_gib") is not None:
        total = case.num("max_allowed_gib")
    if requested is not None:
        numbers = f" It asked for {gib(requested)}"
        if total is not None:
            numbers += f" on a {gib(total)} device"
        if free is not None:
            numbers += f" with {gib(free)} free"
        if allocated is not None:
            numbers += f" and {gib(allocated)} held by live tensors"
        numbers += "."
    elif peak is not None:
        numbers = f" The measured peak before the failure was {gib(peak)}."
    if case.step is not None:
        numbers += f" It failed at step {case.step}."
    measured = _measured_before(case, total)
    numbers += measured
    fragmented = reserved_free is not None and requested is not None and reserved_free >= requested
    fixes: list[Fix] = []
    if "cpu-alloc-failed" in case.sources:
        return _host_allocation(case, requested)
    if fragmented:
        diagnosis = (
            f"The allocator ran out of contiguous memory, not of memory:{numbers} "
            f"{gib(reserved_free)} were reserved but unallocated, more than the request — fragmentation."
        )
        fixes.append(_fragmentation_fix(case))
    else:
        diagnosis = (
            "The step needs more device memory than is free." + numbers
            + ("" if measured else
               " Find out whether parameters, optimizer state or activations dominate before cutting the batch.")
        )
        if case.step is not None and case.step > 1:
            diagnosis += " Failing only after the first steps points at growth (a leak) or at the first optimizer step allocating its state."
    if case.has("eval"):
        fixes.append(_inference_fix(case))
    fixes += [_bf16_fix(), _checkpointing_fix(), _accumulation_fix()]
    if not fragmented:
        fixes.append(_fragmentation_fix(case))
    next_steps = [
        f"`{case.fit_cmd(total)}` estimates the step's peak on this card without a GPU (fake tensors): "
        "parameters, gradients, optimizer state and activations, the largest batch that fits, and what bf16, "
        "activation checkpointing or sharding would change, each measured.",
        f"`{case.run_cmd('memory', extra='--steps 5')}` measures the peak and splits it into parameters, "
        "gradients, optimizer state and activations; add `--gpu-memory 10GiB` for a fit verdict.",
        "On CUDA, record the allocator's history and open the snapshot at pytorch.org/memory_viz:\n" + advice.snippet("memory", "snapshot"),
    ]
    return Advice(diagnosis, fixes, next_steps)


def _measured_before(case: Case, card: float | None) -> str:
    """The breakdown a run measured on an earlier step, scaled to the card that ran out."""
    parts = [(label, case.num(f"measured_{key}_gib")) for label, key in
             (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer state", "optimizer_state"),
              ("activations", "activations"))]
    known = [f"{label} {gib(value)}" for label, value in parts if value is not None]
    if not known:
        return ""
    batch = case.num("measured_batch_size")
    text = " Measured on an earlier step: " + ", ".join(known) + (f" at batch {batch:.0f}" if batch else "") + "."
    fits = case.num("batch_that_fits")
    spare = case.num("spare_fraction") or 0.0
    if fits is not None and card is not None:
        text += (f" Scaled to this {gib(card)} card, with activations growing with the batch, about "
                 f"{fits:.0f} samples per step fit with {spare:.0%} to spare.") if fits else (
                 f" Parameters, gradients and optimizer state alone leave no room on this {gib(card)} card.")
    return text


def _host_allocation(case: Case, requested: float | None) -> Advice:
    size = f" of {gib(requested)}" if requested is not None else ""
    return Advice(
        f"The CPU allocator could not get an allocation{size} from host RAM: a tensor this large does not fit in "
        "what the machine (or the container's memory limit) has left.",
        [
            advice.fix("memory", "load-lazily", location=case.location),
            _accumulation_fix(),
        ],
        [f"`{case.run_cmd('memory', extra='--steps 5')}` records the process RSS per step."],
    )


@SPECIALIST.handles("memory-growth")
def memory_growth(case: Case) -> Advice:
    where = case.at()
    slope = case.num("slope_mib_per_step")
    steps = case.num("steps_observed")
    nodes = case.num("graph_nodes_growth_per_step")
    measured = ""
    if slope is not None:
        measured = f" Live memory grows by about {mib(slope)} per step"
        measured += f" over {count(steps, 'step')}." if steps is not None else "."
    if nodes is not None:
        measured += f" The autograd graph kept alive grows by about {nodes:.0f} nodes per step."
    growing = case.text("tensor")
    if growing:
        measured += f" What grows: {growing}."
    name = case.text("variable") or "total_loss"
    holds_graph = _flag(case, "holds_graph", "tensor_holds_graph")
    if where and holds_graph is False:
        # a container of plain tensors (no graph): it grows by what is appended, not by graphs
        diagnosis = f"{where} keeps adding tensors to `{name}` every step, and nothing ever frees them.{measured}"
        fixes = [
            advice.fix("memory", "bounded-container", location=case.location, name=name)
        ]
        return Advice(
            diagnosis,
            fixes,
            [f"`{case.run_cmd('memory', extra='--steps 30')}` measures the growth per step and names what grows."],
        )
    if where:
        diagnosis = f"{where} keeps a tensor that still holds its autograd graph alive across steps.{measured}"
    else:
        diagnosis = (
            "Something keeps tensors (usually a loss with its autograd graph) alive from one step to the next."
            + measured
        )
    fixes = [
        advice.fix("memory", "accumulate-numbers-not-graphs", location=case.location, name=name),
        advice.fix("memory", "detach-kept-tensors"),
        advice.fix("memory", "detach-recurrent-state"),
    ]
    return Advice(
        diagnosis,
        fixes,
        [f"`{case.run_cmd('memory', extra='--steps 30')}` measures the growth per step and names the tensors that grow."],
    )


@SPECIALIST.handles("fragmentation")
def fragmentation(case: Case) -> Advice:
    reserved_free = case.num("reserved_unallocated_gib")
    reserved = case.num("reserved_gib")
    allocated = case.num("allocated_gib")
    amount = ""
    if reserved_free is not None:
        amount = f" ({gib(reserved_free)} reserved but unallocated"
        if reserved is not None:
            amount += f" of {gib(reserved)} reserved"
        amount += ")"
    elif reserved is not None and allocated is not None:
        amount = f" ({gib(reserved)} reserved for {gib(allocated)} of live tensors)"
    return Advice(
        f"The caching allocator holds memory it cannot hand out in one piece{amount}: allocations of varying sizes "
        "have fragmented its segments.",
        [
            _fragmentation_fix(case),
            advice.fix("memory", "regular-shapes"),
        ],
        ["Record a memory snapshot and look for many small free blocks between live ones:\n" + advice.snippet("memory", "snapshot")],
    )


# The share of the peak each kind of memory has, as the memory probe reports it.
_BREAKDOWN = (
    (("activations_gib",), "activations"),
    (("optimizer_state_gib",), "optimizer state"),
    (("parameters_gib",), "parameters"),
    (("gradients_gib",), "gradients"),
)


def _flag(case: Case, *keys: str) -> bool | None:
    """A yes/no evidence value, whether it arrived as a bool or as text."""
    for key in keys:
        value = case.value(key)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    return None


@SPECIALIST.handles("high-memory")
def high_memory(case: Case) -> Advice:
    peak = case.num("peak_gib")
    budget = case.num("budget_gib")
    batch = case.num("batch_size")
    at_batch = f" at batch size {batch:.0f}" if batch is not None else ""
    if peak is not None and budget is not None:
        verdict = "does not fit in" if peak > budget else "leaves little headroom in"
        diagnosis = f"The measured peak of {gib(peak)}{at_batch} {verdict} the {gib(budget)} budget."
    elif peak is not None:
        diagnosis = f"The measured peak is {gib(peak)}{at_batch}, close to what the device has."
    else:
        diagnosis = "To cut memory, first learn what dominates the peak: parameters, gradients, optimizer state or activations."
    parts = [(case.num(*keys), label) for keys, label in _BREAKDOWN]
    known = [(v, label) for v, label in parts if v is not None]
    dominant = max(known)[1] if known else None
    if known:
        diagnosis += " Split: " + ", ".join(f"{label} {gib(v)}" for v, label in sorted(known, reverse=True)) + "."
    by_kind = {
        "activations": [_bf16_fix(), _checkpointing_fix(), _accumulation_fix()],
        "optimizer state": [_optimizer_state_fix(), _bf16_fix()],
        "parameters": [_optimizer_state_fix(), _bf16_fix()],
        "gradients": [_accumulation_fix(), _optimizer_state_fix()],
    }
    fixes = list(by_kind.get(dominant or "activations", by_kind["activations"]))
    for extra in (_bf16_fix(), _checkpointing_fix(), _optimizer_state_fix()):
        if extra.title not in {f.title for f in fixes}:
            fixes.append(extra)
    return Advice(
        diagnosis,
        fixes,
        [f"`{case.run_cmd('memory', extra='--steps 5 --gpu-memory 10GiB')}` gives the peak breakdown and a fit verdict."],
    )


# Messages of a full /dev/shm: the memory specialist owns their fixes (the file_system sharing strategy too).
SHM_SIGNATURES = {"dataloader-shm-limit", "dataloader-bus-error", "shm-open-failed"}


@SPECIALIST.handles("host-oom")
def host_oom(case: Case) -> Advice:
    if case.sources & SHM_SIGNATURES:
        return _shared_memory(case)
    rss = case.num("rss_gib")
    workers = case.num("num_workers")
    facts = ""
    if rss is not None:
        facts = f" The script's processes held {gib(rss)} of host RAM"
        facts += f" with {count(workers, 'DataLoader worker')}." if workers is not None else "."
    pid = case.num("worker_pid")
    signal = case.text("signal")
    if pid is not None:
        facts += f" DataLoader worker (pid {pid:.0f}) was killed" + (f" by {signal}." if signal else ".")
    return Advice(
        "Host RAM ran out: the OOM killer ended a process (often a DataLoader worker); each worker holds a copy of "
        "whatever the Dataset keeps in Python objects." + facts,
        [
            advice.fix("memory", "dataset-in-arrays", location=case.location),
            advice.fix("memory", "fewer-workers"),
        ],
        [f"`{case.run_cmd('memory', 'data')}` records process RSS per step and each DataLoader's settings."],
    )


def _shared_memory(case: Case) -> Advice:
    return Advice(
        "DataLoader workers pass batches to the main process through shared memory (/dev/shm), and it is too small: "
        "containers often mount only 64 MiB there.",
        [
            advice.fix("memory", "container-shm-size", script=case.script),
            advice.fix("memory", "file-system-sharing", location=case.location),
            advice.fix("memory", "fewer-batches-in-flight"),
        ],
        [f"`{case.run_cmd('data', extra='--steps 20')}` records each DataLoader's workers and prefetch."],
    )


@SPECIALIST.handles("empty-cache-in-loop")
def empty_cache(case: Case) -> Advice:
    where = case.at("the training loop")
    return Advice(
        f"torch.cuda.empty_cache() in {where} returns cached blocks to the driver every step, so the next step must "
        "cudaMalloc them again: slower, and it frees no memory that tensors still use.",
        [
            advice.fix("memory", "remove-empty-cache", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD1'))}` lists every such call."],
    )


@SPECIALIST.handles("eval-without-no-grad")
def eval_memory(case: Case) -> Advice:
    extra = case.num("extra_gib")
    cost = f" (measured: {gib(extra)} more than the same forward without grad)" if extra is not None else ""
    where = case.at("Validation")
    return Advice(
        f"{where} runs forward passes with grad enabled: each keeps its activations for a backward that never "
        f"comes{cost}.",
        [_inference_fix(case)],
        [f"`{case.run_cmd('memory', extra='--steps 20')}` compares memory in training and validation passes."],
    )


@SPECIALIST.handles("reentrant-checkpoint")
def checkpoint_memory(case: Case) -> Advice:
    where = case.at("torch.utils.checkpoint")
    return Advice(
        f"{where} runs without an explicit use_reentrant: PyTorch 2.13 warns and falls back to the reentrant "
        "variant, which always recomputes whole blocks and, when no input of a block requires grad, returns an "
        "output without a graph, so the block's parameters silently get no gradients.",
        [
            advice.fix("memory", "use-reentrant-false", location=case.location)
        ],
        [f"`{case.run_cmd('memory', extra='--steps 5')}` measures the peak with and without the change."],
    )


@SPECIALIST.general
def general(case: Case) -> Advice:
    growing = case.num("slope_mib_per_step")
    peak = case.num("peak_gib")
    figures = []
    if peak is not None:
        figures.append(f"peak {gib(peak)}")
    if growing is not None:
        figures.append(f"growth {mib(growing)} per step")
    measured = f" ({', '.join(figures)})" if figures else ""
    symptom = case.symptom.title[:1].lower() + case.symptom.title[1:]
    return Advice(
        f"From the memory side of {symptom}{measured}: measure what holds memory at the peak before changing the model.",
        [_bf16_fix(), _checkpointing_fix()],
        [f"`{case.run_cmd('memory', extra='--steps 5')}` measures the peak and what it is made of."],
    )


"""Tensor operations and memory: OOM, leaks, peaks, fragmentation, host RAM."""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, gib, mib

SPECIALIST = Specialist("memory")

_SNAPSHOT = """\
torch.cuda.memory._record_memory_history(max_entries=100_000)
# ... run the steps that reach the peak ...
torch.cuda.memory._dump_snapshot("oom_snapshot.pickle")  # open at pytorch.org/memory_viz"""


def _fragmentation_fix(case: Case) -> Fix:
    return Fix(
        title="Let the caching allocator grow segments instead of fragmenting",
        snippet=f"PYTORCH_ALLOC_CONF=expandable_segments:True python {case.script}",
        why=(
            "Memory reserved by PyTorch but not allocated is held in blocks too small for the "
            "request; expandable segments map more memory into an existing segment instead of "
            "carving fixed-size ones."
        ),
        verify="The OOM message's 'reserved by PyTorch but unallocated' figure drops, and the run passes the step.",
        applies_when=(
            "CUDA only; set it in the environment before the first CUDA allocation. PYTORCH_ALLOC_CONF is "
            "the current name; the older PYTORCH_CUDA_ALLOC_CONF is still read."
        ),
    )


def _checkpointing_fix() -> Fix:
    return Fix(
        title="Trade compute for activation memory with activation checkpointing",
        snippet=(
            "from torch.utils.checkpoint import checkpoint\n\n"
            "def forward(self, x):\n"
            "    for block in self.blocks:\n"
            "        x = checkpoint(block, x, use_reentrant=False)\n"
            "    return x"
        ),
        why="Activations inside checkpointed blocks are recomputed in backward instead of stored (about one extra forward of compute).",
        verify="torch.cuda.max_memory_allocated() after one step is lower than before.",
        applies_when="Activations, not parameters or optimizer state, dominate the peak (deep nets, long sequences).",
    )


def _bf16_fix() -> Fix:
    return Fix(
        title="Run the forward pass under bfloat16 autocast",
        snippet=(
            "with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n"
            "    loss = criterion(model(x), y)\n"
            "loss.backward()"
        ),
        why="Activations saved for backward are stored in 16 bits, roughly halving activation memory; bf16 needs no GradScaler.",
        verify="Peak memory per step drops; the loss curve matches the fp32 run within noise.",
        applies_when="bf16 needs an Ampere-or-newer GPU (torch.cuda.is_bf16_supported()).",
    )


def _accumulation_fix() -> Fix:
    return Fix(
        title="Keep the batch, halve the micro-batch: gradient accumulation",
        snippet=(
            "accum = 2\nfor i, (x, y) in enumerate(loader):  # loader with batch_size // accum\n"
            "    loss = criterion(model(x), y) / accum\n    loss.backward()\n"
            "    if (i + 1) % accum == 0:\n        optimizer.step()\n        optimizer.zero_grad()"
        ),
        why="Peak activation memory scales with the micro-batch; the effective batch and the gradients stay the same.",
        verify="The step that failed now passes; the loss curve matches the larger batch.",
    )


def _optimizer_state_fix() -> Fix:
    return Fix(
        title="Shrink optimizer state: fused AdamW, or a sharded / 8-bit optimizer",
        snippet=(
            "optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)\n"
            "# several GPUs: shard the state instead of replicating it\n"
            "from torch.distributed.optim import ZeroRedundancyOptimizer\n"
            "optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr)"
        ),
        why="Adam keeps two fp32 tensors per parameter (8 bytes per parameter); ZeRO splits them across ranks.",
        verify="The optimizer-state share of the peak drops (torchdoctor's memory probe prints the split).",
        applies_when="Optimizer state is a large share of the peak (large models, small activations).",
    )


def _inference_fix(case: Case | None = None) -> Fix:
    return Fix(
        title="Run validation without building autograd graphs",
        snippet="model.eval()\nwith torch.inference_mode():\n    for x, y in val_loader:\n        ...\nmodel.train()",
        why="Under grad mode every validation forward keeps its activations alive for a backward that never comes.",
        verify="Validation peak memory falls to roughly the size of one forward pass.",
        location=case.location if case is not None else None,
    )


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
        "On CUDA, record the allocator's history and open the snapshot at pytorch.org/memory_viz:\n" + _SNAPSHOT,
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
            Fix(
                title="Load data lazily instead of materialising it in RAM",
                snippet="data = np.load('features.npy', mmap_mode='r')   # pages are read on access\n"
                "x = torch.from_numpy(np.ascontiguousarray(data[i]))",
                why="A memory-mapped array keeps only the pages in use resident.",
                verify="Process RSS stays well below the machine's memory.",
                location=case.location,
            ),
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
            Fix(
                title=f"Keep numbers, or a bounded window, in `{name}`",
                snippet=f"{name}.append(value.item())            # a float, not a tensor\n"
                f"# or keep only the last N:\nfrom collections import deque\n{name} = deque(maxlen=1000)",
                why="Each appended tensor stays alive as long as the container does, so memory grows linearly with steps.",
                verify="RSS (or torch.cuda.memory_allocated()) stays flat after the first steps.",
                location=case.location,
            )
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
        Fix(
            title=f"Accumulate Python numbers, not graph-holding tensors ({name})",
            snippet=f"{name} += loss.item()      # a float: the graph is freed after backward\n"
            f"# or, to stay on the device without syncing every step:\n{name} += loss.detach()",
            why="`loss` references the whole autograd graph of its step; adding it to a running total chains every step's graph together.",
            verify="Per-step memory (torch.cuda.memory_allocated() or the run probe's census) stays flat after the first steps.",
            location=case.location,
        ),
        Fix(
            title="Detach anything kept for logging or metrics",
            snippet="history.append(outputs.detach().cpu())",
            why="Lists of outputs, losses or hidden states kept across steps hold their graphs unless detached.",
            verify="The number of live tensors stops growing step over step.",
        ),
        Fix(
            title="Carry recurrent state without its history",
            snippet="hidden = hidden.detach()  # truncated backprop through time",
            why="A hidden state passed from one batch to the next links all batches into one ever-growing graph.",
            verify="Backward time per step stays constant instead of growing.",
            applies_when="Only for RNN-style models that carry state across batches.",
        ),
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
            Fix(
                title="Make shapes more regular",
                snippet="# pad or bucket variable-length batches to a few fixed lengths\n"
                "x = torch.nn.functional.pad(x, (0, bucket_len - x.shape[-1]))",
                why="Tensors of ever-changing size leave holes of sizes no later request fits.",
                verify="The gap between torch.cuda.memory_reserved() and memory_allocated() stays small.",
                applies_when="Variable sequence lengths or image sizes.",
            ),
        ],
        ["Record a memory snapshot and look for many small free blocks between live ones:\n" + _SNAPSHOT],
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
            Fix(
                title="Keep dataset storage in arrays or tensors, not Python lists of objects",
                snippet="self.samples = torch.tensor(samples)  # or a numpy array / memory-mapped file",
                why="Forked workers share pages copy-on-write, but touching Python objects updates their refcounts "
                "and copies the pages: lists of objects end up duplicated in every worker.",
                verify="RSS per worker (psutil or top) stays flat instead of climbing over the epoch.",
                location=case.location,
            ),
            Fix(
                title="Use fewer workers or a smaller prefetch",
                snippet="DataLoader(ds, batch_size=64, num_workers=4, prefetch_factor=2)",
                why="Every worker holds prefetch_factor batches and its own copy of touched data.",
                verify="Peak host memory drops by about one worker's share per worker removed.",
            ),
        ],
        [f"`{case.run_cmd('memory', 'data')}` records process RSS per step and each DataLoader's settings."],
    )


def _shared_memory(case: Case) -> Advice:
    return Advice(
        "DataLoader workers pass batches to the main process through shared memory (/dev/shm), and it is too small: "
        "containers often mount only 64 MiB there.",
        [
            Fix(
                title="Give the container more shared memory",
                snippet=f"docker run --shm-size=8g ... python {case.script}",
                why="Each in-flight batch of each worker lives in /dev/shm until the main process takes it.",
                verify="`df -h /dev/shm` inside the container shows the new size; the workers no longer die.",
                applies_when="Inside Docker or Kubernetes (there: an emptyDir volume with medium: Memory on /dev/shm).",
            ),
            Fix(
                title="Or share tensors through files instead of shared-memory segments",
                snippet="import torch.multiprocessing\ntorch.multiprocessing.set_sharing_strategy('file_system')",
                why="The file_system strategy avoids per-tensor shm file descriptors (also the 'too many open files' error).",
                verify="The loader runs a full epoch without bus errors.",
                location=case.location,
            ),
            Fix(
                title="Hold fewer batches in flight",
                snippet="DataLoader(ds, batch_size=64, num_workers=2, prefetch_factor=2)",
                why="Shared memory in use is about num_workers x prefetch_factor batches.",
                verify="No bus error / shm error over an epoch.",
            ),
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
            Fix(
                title="Remove empty_cache() from the loop",
                snippet="for x, y in loader:\n    ...  # no empty_cache() inside the loop\n"
                "torch.cuda.empty_cache()  # once after training, only if another process needs the memory",
                why="The caching allocator reuses freed blocks; emptying the cache only hides memory from nvidia-smi.",
                verify="Step time drops; torch.cuda.memory_allocated() is unchanged.",
                location=case.location,
            )
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
            Fix(
                title="Pass use_reentrant=False",
                snippet="x = checkpoint(block, x, use_reentrant=False)",
                why="The non-reentrant variant stops recomputing as soon as the needed activations exist, records "
                "the graph so parameters get gradients even when the inputs do not require grad, and supports "
                "torch.autograd.grad and nested backward.",
                verify="No use_reentrant warning; peak memory with checkpointing is below the peak without it.",
                location=case.location,
            )
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


"""Tensor operations and memory: OOM, leaks, peaks, fragmentation, host RAM."""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case, Specialist

SPECIALIST = Specialist("memory")

_SNAPSHOT = """\
torch.cuda.memory._record_memory_history(max_entries=100_000)
# ... run the steps that reach the peak ...
torch.cuda.memory._dump_snapshot("oom_snapshot.pickle")  # open at pytorch.org/memory_viz"""


def _gib(value) -> str:
    return f"{value:.2f} GiB" if isinstance(value, (int, float)) else str(value)


def _fragmentation_fix() -> Fix:
    return Fix(
        title="Let the caching allocator grow segments instead of fragmenting",
        snippet="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py",
        why=(
            "Memory reserved by PyTorch but not allocated is held in blocks too small for the "
            "request; expandable segments map more memory into an existing segment instead."
        ),
        verify="The OOM message's 'reserved by PyTorch but unallocated' figure drops, and the run passes the step.",
        applies_when="CUDA only; set it before the first CUDA allocation (in the environment, not mid-script).",
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
        why="Activations of checkpointed blocks are recomputed in backward instead of stored (about 30% more compute).",
        verify="torch.cuda.max_memory_allocated() after one step is lower than before.",
        applies_when="When activations, not parameters or optimizer state, dominate the peak (deep nets, long sequences).",
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


@SPECIALIST.handles("oom")
def out_of_memory(case: Case) -> Advice:
    requested = case.value("requested_gib")
    total = case.value("total_gib")
    reserved_free = case.value("reserved_unallocated_gib")
    allocated = case.value("allocated_gib")
    fixes: list[Fix] = []
    numbers = ""
    if requested is not None:
        numbers = f" It asked for {_gib(requested)}"
        if total is not None:
            numbers += f" on a {_gib(total)} device"
        if allocated is not None:
            numbers += f" with {_gib(allocated)} already allocated by tensors"
        numbers += "."
    fragmented = (
        isinstance(reserved_free, (int, float))
        and isinstance(requested, (int, float))
        and reserved_free >= requested
    )
    if fragmented:
        diagnosis = (
            f"The allocator ran out of contiguous memory, not of memory:{numbers} "
            f"{_gib(reserved_free)} were reserved but unallocated, more than the request — fragmentation."
        )
        fixes.append(_fragmentation_fix())
    else:
        diagnosis = (
            "The step needs more device memory than is free." + numbers
            + " Find out whether parameters, optimizer state or activations dominate before cutting the batch."
        )
    if case.has("eval"):
        fixes.append(
            Fix(
                title="Run validation without building autograd graphs",
                snippet="model.eval()\nwith torch.inference_mode():\n    for x, y in val_loader:\n        ...",
                why="Under grad mode every validation forward keeps its activations alive until the output is freed.",
                verify="Validation peak memory falls to roughly the size of one forward pass.",
            )
        )
    fixes += [
        _bf16_fix(),
        _checkpointing_fix(),
        Fix(
            title="Keep the batch, halve the micro-batch: gradient accumulation",
            snippet=(
                "accum = 2\nfor i, (x, y) in enumerate(loader):  # loader with batch_size // accum\n"
                "    loss = criterion(model(x), y) / accum\n    loss.backward()\n"
                "    if (i + 1) % accum == 0:\n        optimizer.step()\n        optimizer.zero_grad()"
            ),
            why="Peak activation memory scales with the micro-batch; the effective batch and the gradients stay the same.",
            verify="The step that failed now passes; the loss curve matches the larger batch.",
        ),
    ]
    if not fragmented:
        fixes.append(_fragmentation_fix())
    next_steps = [
        f"`{case.run_cmd('memory', extra='--steps 5')}` measures the peak and splits it into parameters, "
        "gradients, optimizer state and activations; add `--gpu-memory 10GiB` for a fit verdict.",
        "On CUDA, record the allocator's history and open the snapshot at pytorch.org/memory_viz:\n" + _SNAPSHOT,
    ]
    return Advice(diagnosis, fixes, next_steps)


@SPECIALIST.handles("memory-growth")
def memory_growth(case: Case) -> Advice:
    where = case.at()
    slope = case.value("slope_mib_per_step")
    measured = f" Live memory grows by about {slope:.1f} MiB per step." if isinstance(slope, (int, float)) else ""
    name = case.value("variable", "total_loss")
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
    reserved_free = case.value("reserved_unallocated_gib")
    amount = f" ({_gib(reserved_free)} reserved but unallocated)" if reserved_free is not None else ""
    return Advice(
        f"The caching allocator holds memory it cannot hand out in one piece{amount}: allocations of varying sizes "
        "have fragmented its segments.",
        [
            _fragmentation_fix(),
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


@SPECIALIST.handles("high-memory")
def high_memory(case: Case) -> Advice:
    peak = case.value("peak_gib")
    budget = case.value("budget_gib")
    if peak is not None and budget is not None:
        diagnosis = f"The measured peak of {_gib(peak)} is above the {_gib(budget)} budget."
    elif peak is not None:
        diagnosis = f"The measured peak is {_gib(peak)}, close to what the device has."
    else:
        diagnosis = "To cut memory, first learn what dominates the peak: parameters, gradients, optimizer state or activations."
    return Advice(
        diagnosis,
        [
            _bf16_fix(),
            _checkpointing_fix(),
            Fix(
                title="Free the gradients and use a lighter optimizer state",
                snippet="optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)\n"
                "optimizer.zero_grad()  # sets grads to None (the default since PyTorch 2.0)",
                why="Adam keeps two fp32 states per parameter (8 bytes each); fused kernels avoid extra temporaries.",
                verify="The optimizer-state share of the peak drops.",
                applies_when="When optimizer state is a large share of the peak (large models, small activations).",
            ),
        ],
        [f"`{case.run_cmd('memory', extra='--steps 5 --gpu-memory 10GiB')}` gives the peak breakdown and a fit verdict."],
    )


@SPECIALIST.handles("host-oom")
def host_oom(case: Case) -> Advice:
    return Advice(
        "Host RAM ran out: the OOM killer ended a process (often a DataLoader worker); each worker holds a copy of "
        "whatever the Dataset keeps in Python objects.",
        [
            Fix(
                title="Keep dataset storage in arrays or tensors, not Python lists of objects",
                snippet="self.samples = torch.tensor(samples)  # or a numpy array / memory-mapped file",
                why="Forked workers share pages copy-on-write, but touching Python objects updates their refcounts "
                "and copies the pages: lists of objects end up duplicated in every worker.",
                verify="RSS per worker (psutil or top) stays flat instead of climbing over the epoch.",
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


@SPECIALIST.handles("empty-cache-in-loop")
def empty_cache(case: Case) -> Advice:
    where = case.at("the training loop")
    return Advice(
        f"torch.cuda.empty_cache() in {where} returns cached blocks to the driver every step, so the next step must "
        "cudaMalloc them again: slower, and it frees no memory that tensors still use.",
        [
            Fix(
                title="Remove empty_cache() from the loop",
                snippet="# delete the call; if another process needs the memory, call it once after training",
                why="The caching allocator reuses freed blocks; emptying the cache only hides memory from nvidia-smi.",
                verify="Step time drops; torch.cuda.memory_allocated() is unchanged.",
                location=case.location,
            )
        ],
        [],
    )


@SPECIALIST.general
def general(case: Case) -> Advice:
    return Advice(
        "From the memory side: measure what holds memory at the peak before changing the model.",
        [_bf16_fix(), _checkpointing_fix()],
        [f"`{case.run_cmd('memory', extra='--steps 5')}` measures the peak and what it is made of."],
    )

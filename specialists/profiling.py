"""Performance profiling: measure first; data stalls, host syncs, launch overhead, torch.compile."""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, ms, pct

SPECIALIST = Specialist("profiling")

_PROFILER = """\
from torch.profiler import ProfilerActivity, profile, schedule
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
             schedule=schedule(wait=1, warmup=2, active=5)) as prof:
    for step, (x, y) in enumerate(loader):
        train_step(x, y)
        prof.step()
        if step == 8:
            break
print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15))
prof.export_chrome_trace("trace.json")  # open in ui.perfetto.dev"""

# The parts a step splits into, as the profile probe reports them.
_PARTS = (
    ("data_wait_fraction", "data wait"),
    ("forward_fraction", "forward"),
    ("backward_fraction", "backward"),
    ("optimizer_fraction", "optimizer"),
    ("other_fraction", "other"),
)


def _profile_step(case: Case) -> str:
    return (
        f"`{case.run_cmd('profile', extra='--steps 20')}` splits the step into data wait, forward, backward and "
        "optimizer, counts host syncs and writes a Perfetto trace."
    )


def _loader_fix(case: Case, workers: float | None = None) -> Fix:
    now = f" (now {workers:.0f})" if workers is not None else ""
    return Fix(
        title=f"Load batches in parallel worker processes{now}",
        snippet=(
            "loader = DataLoader(ds, batch_size=64, shuffle=True,\n"
            "                    num_workers=min(8, os.cpu_count()), pin_memory=True,\n"
            "                    persistent_workers=True, prefetch_factor=4)\n"
            "for x, y in loader:\n"
            "    x = x.to(device, non_blocking=True)\n"
            "    y = y.to(device, non_blocking=True)"
        ),
        why="With num_workers=0 every __getitem__ and collate runs in the training process between steps; workers "
        "prepare the next batches while the GPU computes. Pinned memory plus non_blocking=True overlaps the copy.",
        verify="The data-wait share of the step drops below 10%.",
        location=case.location,
    )


def _compile_fix() -> Fix:
    return Fix(
        title="Fuse small ops with torch.compile, once, outside the loop",
        snippet="model = torch.compile(model)   # add mode='reduce-overhead' for CUDA graphs on small batches",
        why="Fusion turns chains of element-wise kernels into one; CUDA graphs replay a whole step with one launch.",
        verify="Steps per second after the first (compiling) steps rise; the kernel count per step falls.",
        applies_when="The model compiles without many graph breaks; the first steps pay compilation time.",
    )


@SPECIALIST.handles("slow-step")
def slow_step(case: Case) -> Advice:
    step_ms = case.num("step_ms")
    parts = [(case.num(key), label) for key, label in _PARTS]
    known = sorted([(v, label) for v, label in parts if v is not None], reverse=True)
    if step_ms is not None or known:
        facts = f"A step takes {ms(step_ms)}" if step_ms is not None else "The step time splits"
        if known:
            facts += (": " if step_ms is not None else " into ") + ", ".join(f"{label} {pct(v)}" for v, label in known)
        facts += "."
        top = case.text("top_op")
        if top:
            facts += f" The top operator by self time is `{top}`."
    else:
        facts = "The step is slow, and nothing has been measured yet: profile one short window before changing anything."
    dominant = known[0][1] if known else None
    fixes: list[Fix] = []
    if dominant == "data wait":
        fixes.append(_loader_fix(case, case.num("num_workers")))
    elif dominant == "optimizer":
        fixes.append(_fused_optimizer_fix())
    fixes += [
        Fix(
            title="Profile a short window of steps",
            snippet=_PROFILER,
            why="The table and trace show where the step goes (data, compute, launches, syncs); fixes differ for each.",
            verify="The trace shows a dominant cost that one change can address.",
        ),
        _compile_fix(),
    ]
    if dominant != "data wait":
        fixes.append(_loader_fix(case, case.num("num_workers")))
    return Advice(facts, fixes, [_profile_step(case)])


def _fused_optimizer_fix() -> Fix:
    return Fix(
        title="Use a fused (or foreach) optimizer implementation",
        snippet="optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)",
        why="The fused kernel updates all parameters in a few launches instead of several per parameter tensor.",
        verify="The optimizer share of the step falls.",
        applies_when="CUDA (and CPU for some optimizers) with floating-point parameters.",
    )


@SPECIALIST.handles("dataloader-bound")
def dataloader_bound(case: Case) -> Advice:
    wait = case.num("data_wait_fraction")
    step_ms = case.num("step_ms")
    workers = case.num("num_workers", "workers")
    suggested = case.num("suggested_max_workers")
    timeout = case.num("timeout_s")
    where = case.at()
    if wait is not None:
        facts = f"The step waits on data {pct(wait)} of the time"
        if step_ms is not None:
            facts += f" ({ms(wait * step_ms)} of a {ms(step_ms)} step)"
    else:
        facts = "The step waits on data"
    if timeout is not None:
        facts = f"A DataLoader batch took longer than its {timeout:.0f} s timeout"
    if workers is not None:
        facts += f" with num_workers={workers:.0f}"
    if suggested is not None:
        facts += f" on a machine that suggests at most {suggested:.0f} workers"
    if where:
        facts += f"; the DataLoader is built at {where}"
    facts += ". Faster compute (AMP, compile) would not help until loading keeps up."
    fixes = [_loader_fix(case, workers)]
    fixes.append(
        Fix(
            title="Move per-sample work out of __getitem__",
            snippet=(
                "# decode/resize once offline, or batch the transform on the GPU:\n"
                "x = x.to(device, non_blocking=True)\n"
                "x = gpu_transforms(x)   # e.g. normalisation / augmentation on whole batches"
            ),
            why="Python-level per-sample decoding and augmentation often costs more than the model's step.",
            verify="The time of one `next(iter(loader))` over 50 batches drops.",
            applies_when="__getitem__ decodes files or runs heavy augmentation.",
        )
    )
    fixes.append(
        Fix(
            title="Keep workers alive across epochs",
            snippet="DataLoader(ds, num_workers=8, persistent_workers=True)",
            why="Without it, every epoch starts new worker processes and re-imports / re-opens the dataset.",
            verify="The first steps of each epoch are no slower than the rest.",
            applies_when="With num_workers > 0 and several epochs.",
        )
    )
    return Advice(
        facts,
        fixes,
        [
            f"`{case.run_cmd('profile', 'data', extra='--steps 30')}` ties the data wait to each DataLoader's settings.",
        ],
    )


@SPECIALIST.handles("dataloader-rebuilt")
def dataloader_rebuilt(case: Case) -> Advice:
    built = case.num("constructions")
    start = case.num("first_batch_ms_median")
    facts = f"A DataLoader is constructed again and again at {case.at('one line')}"
    if built is not None:
        facts += f" ({built:.0f} times)"
    facts += ": every construction starts new worker processes and refills their prefetch queue"
    if start is not None:
        facts += f", {ms(start)} before its first batch each time"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="Build each loader once, before the epoch loop",
                snippet=(
                    "train_loader = DataLoader(train_ds, batch_size=32, shuffle=True, num_workers=4,\n"
                    "                          persistent_workers=True)\n"
                    "for epoch in range(epochs):\n"
                    "    for x, y in train_loader:   # shuffle=True reshuffles every pass\n"
                    "        ..."
                ),
                why="A DataLoader is reusable: iterating it again starts a new epoch (with a new shuffle). "
                "persistent_workers=True then keeps its workers alive between epochs.",
                verify="The first batch of each epoch comes as fast as the others.",
                location=case.location,
            )
        ],
        [_profile_step(case)],
    )


@SPECIALIST.handles("host-sync")
def host_sync(case: Case) -> Advice:
    syncs = case.num("syncs_per_step")
    call = case.text("call")
    where = case.at()
    facts = "The step forces the host to wait for the device"
    if syncs is not None:
        facts = f"The step forces {count(syncs, 'host-device synchronisation')} per step"
    if call and where:
        facts += f", e.g. `{call}` at {where}"
    elif where:
        facts += f", e.g. at {where}"
    facts += ": each one drains the GPU queue, so the CPU cannot run ahead and queue the next kernels."
    return Advice(
        facts,
        [
            Fix(
                title="Accumulate metrics on the device; read them every N steps",
                snippet=(
                    "running = torch.zeros((), device=device)\n"
                    "for step, (x, y) in enumerate(loader):\n"
                    "    loss = train_step(x, y)\n"
                    "    running += loss.detach()\n"
                    "    if step % 100 == 0:\n"
                    "        print(f'loss {running.item() / 100:.4f}')   # one sync per 100 steps\n"
                    "        running.zero_()"
                ),
                why="`.item()`, `.cpu()`, `.tolist()`, `print(tensor)` and `if tensor:` all wait for the device to "
                "finish everything queued so far.",
                verify="Host syncs per step fall to 0 on most steps; GPU utilisation rises.",
                location=case.location,
            ),
            Fix(
                title="Replace data-dependent Python branches with tensor ops",
                snippet="x = torch.where(mask, a, b)          # instead of: if mask.any(): ...\n"
                "loss = loss * valid.float()          # instead of: if valid: ...",
                why="A Python `if` on a tensor value needs that value on the host.",
                verify="The profiler shows no cudaStreamSynchronize / aten::item inside the step.",
            ),
        ],
        [
            _profile_step(case),
            "On CUDA, make PyTorch report every synchronising call with its stack: "
            "`torch.cuda.set_sync_debug_mode('warn')` at the top of the script.",
        ],
    )


@SPECIALIST.handles("low-gpu-util")
def low_gpu_util(case: Case) -> Advice:
    util = case.num("gpu_util")
    wait = case.num("data_wait_fraction")
    facts = "The GPU is idle for much of the step"
    if util is not None:
        facts = f"The GPU is busy only {pct(util)} of the time"
    if wait is not None:
        facts += f", and {pct(wait)} of the step is spent waiting for data"
    facts += "."
    fixes = []
    if wait is not None and wait >= 0.2:
        fixes.append(_loader_fix(case, case.num("num_workers")))
    fixes += [
        Fix(
            title="Give the GPU more work per launch: a larger batch",
            snippet="loader = DataLoader(ds, batch_size=256, num_workers=8, pin_memory=True)",
            why="Small batches leave the GPU waiting on Python and kernel-launch overhead between tiny kernels.",
            verify="GPU utilisation (nvidia-smi or the profile probe) rises; samples per second rise.",
            applies_when="Memory allows; rescale the learning rate for the larger batch.",
        ),
        _compile_fix(),
    ]
    if not (wait is not None and wait >= 0.2):
        fixes.append(_loader_fix(case, case.num("num_workers")))
    return Advice(facts, fixes, [_profile_step(case)])


@SPECIALIST.handles("launch-bound")
def launch_bound(case: Case) -> Advice:
    kernels = case.num("kernels_per_step")
    mean_us = case.num("mean_kernel_us")
    facts = "The step is made of many tiny kernels: CPU-side dispatch and launch overhead, not GPU compute, sets the pace"
    if kernels is not None:
        facts += f" ({count(kernels, 'kernel')} per step"
        facts += f", {mean_us:.0f} µs each on average)" if mean_us is not None else ")"
    facts += "."
    return Advice(
        facts,
        [
            _compile_fix(),
            _fused_optimizer_fix(),
            Fix(
                title="Vectorise Python loops over small tensors",
                snippet="out = torch.stack([layer(x) for layer in heads])   # N launches per layer op\n"
                "out = torch.einsum('bd,hdo->hbo', x, weights)      # one batched op",
                why="Each Python iteration dispatches its own kernels; one batched op replaces N launches.",
                verify="The kernel count per step falls by roughly the loop length.",
                location=case.location,
            ),
        ],
        [_profile_step(case)],
    )


@SPECIALIST.handles("graph-break")
def graph_break(case: Case) -> Advice:
    breaks = case.num("graph_breaks")
    reason = case.text("reason", "detail")
    where = case.at() or case.text("location")
    if not where and case.text("file") and case.num("line") is not None:
        where = f"{case.text('file')}:{case.num('line'):.0f}"
    facts = "torch.compile splits the model into several graphs"
    if breaks is not None:
        facts = f"torch.compile breaks the graph {count(breaks, 'time')}"
    if where:
        facts += f", at {where}"
    if reason:
        facts += f" ({reason})"
    facts += ": each break returns to Python and ends fusion at that point."
    low = (reason or "").lower()
    fixes: list[Fix] = []
    if "print" in low or "logging" in low or "builtin" in low:
        fixes.append(_print_fix(case))
    if any(k in low for k in ("item", "data-dependent", "data dependent", "tensor.tolist", "jump")):
        fixes.append(_data_dependent_fix(case))
    for fix in (_print_fix(case), _data_dependent_fix(case), _disable_fix()):
        if fix.title not in {f.title for f in fixes}:
            fixes.append(fix)
    for fix in fixes[1:]:
        fix.location = None  # the user's line belongs to the first, most likely fix
    return Advice(
        facts,
        fixes,
        [
            f"`TORCH_LOGS=graph_breaks python {case.script}` prints every break with its reason and user line.",
            "`torch._dynamo.explain(model)(x)` returns the break count and reasons for one input.",
            f"`{case.run_cmd('compile', extra='--compile-backend eager --steps 5')}` collects breaks and recompiles fast on CPU.",
        ],
    )


def _print_fix(case: Case) -> Fix:
    return Fix(
        title="Move prints, logging and other side effects out of the compiled forward",
        snippet="def forward(self, x):\n    h = self.body(x)\n    return self.head(h)\n\n"
        "out = model(x)\nif step % 100 == 0:\n    print(out.mean().item())   # outside the compiled region",
        why="Dynamo cannot trace I/O; each print ends the current graph and starts a new one after it.",
        verify="TORCH_LOGS=graph_breaks shows no break at that line.",
        location=case.location,
    )


def _data_dependent_fix(case: Case) -> Fix:
    return Fix(
        title="Express data-dependent branches as tensor ops",
        snippet="x = torch.where(x.sum() > 0, x, -x)   # instead of: if x.sum() > 0:",
        why="A Python `if` on a tensor value (or `.item()`) needs the value at trace time, so dynamo breaks the graph there.",
        verify="torch._dynamo.explain(model)(x).graph_break_count drops.",
        location=case.location,
    )


def _disable_fix() -> Fix:
    return Fix(
        title="Fence off code that cannot be traced",
        snippet="@torch.compiler.disable\ndef postprocess(out):\n    ...   # third-party / numpy code runs eagerly",
        why="An explicit boundary gives one clean break instead of dynamo failing over and over inside the function.",
        verify="The break reasons name only the fenced function.",
        applies_when="For code you cannot rewrite in torch ops.",
    )


@SPECIALIST.handles("recompile")
def recompile(case: Case) -> Advice:
    n = case.num("recompiles")
    guard = case.text("guard", "last_reason", "reason")
    fn = case.text("function")
    limit = case.num("limit")
    where = case.at() or case.text("function_location")
    facts = "torch.compile recompiles the same code"
    if n is not None:
        facts = f"torch.compile recompiled {count(n, 'time')}"
    if fn:
        facts += f" `{fn}`"
    if limit is not None:
        facts += f" until it hit the recompile limit of {limit:.0f}"
    if where:
        facts += f" ({where})"
    if guard:
        facts += f"; the failing guard: `{guard}`"
    facts += (
        ". Each recompile costs seconds, and past torch._dynamo.config.recompile_limit (8 by default) dynamo "
        "stops compiling that function and runs it eagerly (or raises under fullgraph=True)."
    )
    low = (guard or "").lower()
    shape = "size mismatch" in low or "shape" in low
    fixes = [
        Fix(
            title="Mark the varying dimension dynamic up front",
            snippet="torch._dynamo.mark_dynamic(x, 1)   # dim 1 (sequence length) varies\nout = model(x)\n"
            "# or compile for dynamic shapes from the start:\nmodel = torch.compile(model, dynamic=True)",
            why="Dynamo specialises on the first shape it sees and recompiles when it changes; a dynamic dimension "
            "gets one kernel for all sizes.",
            verify="TORCH_LOGS=recompiles prints no new recompile for new lengths.",
            location=case.location if shape else None,
        ),
        Fix(
            title="Pad inputs to a few bucket sizes",
            snippet="bucket = 64 * ((x.shape[1] + 63) // 64)\nx = F.pad(x, (0, bucket - x.shape[1]))",
            why="A handful of static shapes compile once each and keep fully specialised kernels.",
            verify="The recompile count stops at the number of buckets.",
        ),
        Fix(
            title="Pass changing Python numbers as tensors",
            snippet="scale = torch.tensor(scale, device=x.device)   # not a Python float that changes per call\nout = model(x, scale)",
            why="Python scalars (and module attributes) are guarded as constants: a new value means a new graph.",
            verify="The guard on that value disappears from TORCH_LOGS=recompiles.",
            location=None if shape else case.location,
        ),
    ]
    if not shape and guard:
        fixes.insert(0, fixes.pop(2))
    fixes.append(
        Fix(
            title="Raise the recompile limit only for a known, small set of variants",
            snippet="torch._dynamo.config.recompile_limit = 16",
            why="Some code legitimately needs a few specialised graphs (e.g. train and eval modes, two input "
            "resolutions); the limit then cuts compilation off too early.",
            verify="TORCH_LOGS=recompiles shows a fixed number of recompiles that stops growing.",
            applies_when="The number of variants is bounded; for ever-changing shapes, use dynamic shapes instead.",
        )
    )
    return Advice(
        facts,
        fixes,
        [
            f"`TORCH_LOGS=recompiles python {case.script}` prints each recompile with the guard that failed.",
            f"`{case.run_cmd('compile', extra='--compile-backend eager --steps 20')}` counts recompiles and their guards.",
        ],
    )


@SPECIALIST.handles("compile-in-loop")
def compile_in_loop(case: Case) -> Advice:
    where = case.at()
    return Advice(
        f"torch.compile is called inside the training loop{' at ' + where if where else ''}: every call wraps the "
        "model again, and changed closures or guards can trigger recompilation.",
        [
            Fix(
                title="Compile once, before the loop",
                snippet="model = torch.compile(model)\nfor x, y in loader:\n    loss = criterion(model(x), y)",
                why="Compilation is cached per code object and guards; recompiling in the loop repeats the expensive "
                "first-step cost and grows the cache.",
                verify="Only the first steps are slow; TORCH_LOGS=recompiles stays quiet.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD5'))}` finds compile calls inside loops."],
    )


@SPECIALIST.handles("manual-attention")
def manual_attention(case: Case) -> Advice:
    where = case.at("The attention code")
    return Advice(
        f"{where} computes softmax(q @ kᵀ) @ v by hand: it materialises the full attention matrix and launches "
        "several kernels where one fused kernel would do.",
        [_sdpa_fix(case)],
        [_profile_step(case)],
    )


def _sdpa_fix(case: Case) -> Fix:
    return Fix(
        title="Call F.scaled_dot_product_attention",
        snippet="out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # q, k, v: (batch, heads, seq, head_dim)",
        why="It dispatches to Flash / memory-efficient kernels when inputs allow, never storing the seq x seq "
        "matrix; is_causal=True is faster than an explicit mask.",
        verify="Attention time in the profile drops; peak memory for long sequences drops.",
        location=case.location,
        applies_when="Flash attention needs fp16/bf16 inputs on a recent GPU; other backends cover the rest.",
    )


@SPECIALIST.handles("slow-custom-layer")
def slow_custom_layer(case: Case) -> Advice:
    name = case.text("module")
    facts = f"The custom layer `{name}`" if name else "The custom layer"
    facts += " needs measuring"
    facts += ": label it in the profiler to see which of its ops dominate."
    return Advice(
        facts,
        [
            Fix(
                title="Label the layer so the profiler attributes time to it",
                snippet="def forward(self, x):\n    with torch.profiler.record_function('MyLayer'):\n        return self.body(x)",
                why="record_function ranges show up in the operator table and the trace.",
                verify="The layer appears with its own total in prof.key_averages().",
                location=case.location,
            ),
            _compile_fix(),
        ],
        [_profile_step(case)],
    )


@SPECIALIST.handles("accumulation-without-no-sync")
def accumulation_comm(case: Case) -> Advice:
    reduces = case.num("allreduces_per_step")
    micro = case.num("micro_steps")
    facts = "Each micro-step all-reduces the gradients"
    if reduces is not None:
        facts = f"Each optimizer step runs {count(reduces, 'gradient all-reduce')}"
        if micro is not None:
            facts += f" for {count(micro, 'micro-step')}"
    facts += ": the communication of all but the last micro-step is wasted time."
    return Advice(
        facts,
        [
            Fix(
                title="Measure the communication share before and after no_sync()",
                snippet=_PROFILER,
                why="In the trace, allreduce kernels (nccl:all_reduce / gloo) on every micro-step show the cost directly.",
                verify="After adding no_sync(), the trace shows one all-reduce round per optimizer step.",
            )
        ],
        [_profile_step(case)],
    )


@SPECIALIST.handles("straggler")
def straggler(case: Case) -> Advice:
    rank = case.rank
    slower = case.num("slowdown")
    facts = "One rank is consistently slower and every collective waits for it"
    if rank is not None:
        facts = f"Rank {rank} is consistently slower and every collective waits for it"
    if slower is not None:
        facts += f" ({slower:.2f}x the median step time)"
    facts += ". Profile that rank alone."
    return Advice(
        facts,
        [
            Fix(
                title="Profile the slow rank and compare with a fast one",
                snippet=_PROFILER.replace('export_chrome_trace("trace.json")', 'export_chrome_trace(f"trace_rank{rank}.json")'),
                why="The slow rank's trace shows whether it waits on data, on its own compute (a slower or throttled "
                "GPU) or on the host.",
                verify="Both traces show similar step splits after the fix.",
            )
        ],
        [_profile_step(case)],
    )


@SPECIALIST.handles("anomaly-detection-enabled")
def anomaly_cost(case: Case) -> Advice:
    slowdown = case.num("slowdown")
    cost = f" ({slowdown:.1f}x slower steps, measured)" if slowdown is not None else ""
    return Advice(
        f"Anomaly detection records a Python traceback for every op and checks every backward result{cost}: a large "
        "constant cost on every step.",
        [
            Fix(
                title="Switch anomaly detection off for training runs",
                snippet="torch.autograd.set_detect_anomaly(False)",
                why="It is meant for a single reproducing step, not for training.",
                verify="Steps per second return to the normal figure.",
                location=case.location,
            )
        ],
        [_profile_step(case)],
    )


@SPECIALIST.handles("empty-cache-in-loop")
def empty_cache_cost(case: Case) -> Advice:
    where = case.at("the loop")
    return Advice(
        f"torch.cuda.empty_cache() in {where} releases cached memory every step, so the next step pays for "
        "cudaMalloc again and the allocator synchronises.",
        [
            Fix(
                title="Remove the per-step empty_cache() call",
                snippet="for x, y in loader:\n    train_step(x, y)   # no torch.cuda.empty_cache() here",
                why="The caching allocator exists to avoid cudaMalloc/cudaFree in the step.",
                verify="Step time drops in the profile; cudaMalloc calls disappear from the trace.",
                location=case.location,
            )
        ],
        [_profile_step(case)],
    )


@SPECIALIST.handles("host-oom")
def host_oom_loader(case: Case) -> Advice:
    workers = case.num("num_workers")
    facts = "From the data-loading side: host memory grows with the number of workers and their prefetch"
    if workers is not None:
        facts += f" ({count(workers, 'worker')} here)"
    facts += "."
    return Advice(
        facts,
        [
            Fix(
                title="Balance workers against host memory",
                snippet="DataLoader(ds, batch_size=64, num_workers=4, prefetch_factor=2, persistent_workers=True)",
                why="Each worker keeps prefetch_factor batches ready and its own copy of touched Python objects.",
                verify="The data-wait share stays low while RSS stays within the host's memory.",
                location=case.location,
            )
        ],
        [f"`{case.run_cmd('memory', 'data', 'profile')}` shows RSS and data wait side by side."],
    )


@SPECIALIST.handles("compile-failed")
def compile_failed(case: Case) -> Advice:
    backend = case.text("backend")
    error = case.text("error")
    facts = "torch.compile failed"
    if backend:
        facts += f" in the `{backend}` backend"
    if error:
        facts += f" ({error})"
    if "inductor-triton-missing" in case.sources:
        facts = "Inductor needs Triton to generate GPU kernels, and it is not installed"
    facts += ": the model cannot be compiled as is; find the stage that fails before working around it."
    return Advice(
        facts,
        [
            Fix(
                title="Bisect by backend to find the failing stage",
                snippet="model = torch.compile(model, backend='eager')      # graph capture only\n"
                "model = torch.compile(model, backend='aot_eager')  # + AOTAutograd\n"
                "model = torch.compile(model)                       # + inductor code generation",
                why="If 'eager' works but inductor fails, the model is fine and the toolchain (C++ compiler on CPU, "
                "Triton on GPU) is the problem.",
                verify="The last backend that works is the stage boundary.",
                location=case.location,
            ),
            Fix(
                title="Compile only the part that compiles",
                snippet="model.encoder = torch.compile(model.encoder)   # leave the failing part eager",
                why="Compiling submodules keeps most of the speed-up while the failing part is investigated.",
                verify="Training runs; the compiled part shows up in the profile as fused kernels.",
                applies_when="One submodule fails and the rest compiles.",
            ),
        ],
        [
            f"`TORCHDYNAMO_VERBOSE=1 python {case.script}` prints the full compiler traceback.",
            f"`{case.run_cmd('compile', extra='--compile-backend eager --steps 5')}` checks graph capture alone.",
        ],
    )


@SPECIALIST.handles("dataloader-worker-error")
def worker_error_perf(case: Case) -> Advice:
    return Advice(
        "From the data-loading side: until the workers start reliably, the run falls back to loading in the main "
        "process or fails; fix the worker error first, then tune num_workers for speed.",
        [_loader_fix(case, case.num("num_workers", "workers"))],
        [f"`{case.run_cmd('data', 'profile', extra='--steps 20')}` measures the data wait once workers run."],
    )


@SPECIALIST.general
def general(case: Case) -> Advice:
    symptom = case.symptom.title[:1].lower() + case.symptom.title[1:]
    return Advice(
        f"From the performance side of {symptom}: measure the step (data wait, compute, syncs) before optimising.",
        [
            Fix(
                title="Profile a short window of steps",
                snippet=_PROFILER,
                why="It shows where the time goes before any change is made.",
                verify="A dominant cost is visible in the table or trace.",
            )
        ],
        [_profile_step(case)],
    )

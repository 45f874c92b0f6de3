"""Performance profiling: measure first; data stalls, host syncs, launch overhead, torch.compile.

The fixes themselves are data (rules/data/advice/profiling.toml); this module decides which apply,
in which order, and which line each is pinned to.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.rules import catalog
from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, ms, pct

SPECIALIST = Specialist("profiling")


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
    return advice.fix("profiling", "loader-workers", location=case.location, now=now)


def _compile_fix() -> Fix:
    return advice.fix("profiling", "torch-compile")


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
        advice.fix("profiling", "profile-window"),
        _compile_fix(),
    ]
    if dominant != "data wait":
        fixes.append(_loader_fix(case, case.num("num_workers")))
    return Advice(facts, fixes, [_profile_step(case)])


def _fused_optimizer_fix() -> Fix:
    return advice.fix("profiling", "fused-optimizer")


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
    fixes.append(advice.fix("profiling", "per-sample-work-out-of-getitem"))
    fixes.append(advice.fix("profiling", "persistent-workers"))
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
            advice.fix("profiling", "build-loader-once", location=case.location)
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
            advice.fix("profiling", "metrics-on-device", location=case.location),
            advice.fix("profiling", "sync-free-branches"),
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
    # data first when the wait alone would make the step dataloader-bound (thresholds.toml [data])
    data_bound = wait is not None and wait >= catalog.load_toml("thresholds.toml")["data"]["wait_fraction"]
    fixes = []
    if data_bound:
        fixes.append(_loader_fix(case, case.num("num_workers")))
    fixes += [
        advice.fix("profiling", "larger-batch"),
        _compile_fix(),
    ]
    if not data_bound:
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
            advice.fix("profiling", "vectorise-loops", location=case.location),
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
    return advice.fix("profiling", "side-effects-out-of-compile", location=case.location)


def _data_dependent_fix(case: Case) -> Fix:
    return advice.fix("profiling", "dynamo-data-dependent-branches", location=case.location)


def _disable_fix() -> Fix:
    return advice.fix("profiling", "compiler-disable")


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
        advice.fix("profiling", "mark-dynamic", location=case.location if shape else None),
        advice.fix("profiling", "bucket-shapes"),
        advice.fix("profiling", "scalars-as-tensors", location=None if shape else case.location),
    ]
    if not shape and guard:
        fixes.insert(0, fixes.pop(2))
    fixes.append(advice.fix("profiling", "raise-recompile-limit"))
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
            advice.fix("profiling", "compile-once", location=case.location)
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
    return advice.fix("profiling", "sdpa", location=case.location)


@SPECIALIST.handles("slow-custom-layer")
def slow_custom_layer(case: Case) -> Advice:
    name = case.text("module")
    facts = f"The custom layer `{name}`" if name else "The custom layer"
    facts += " needs measuring"
    facts += ": label it in the profiler to see which of its ops dominate."
    return Advice(
        facts,
        [
            advice.fix("profiling", "record-function", location=case.location),
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
            advice.fix("profiling", "measure-communication")
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
            advice.fix("profiling", "profile-slow-rank")
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
            advice.fix("profiling", "anomaly-detection-off", location=case.location)
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
            advice.fix("profiling", "remove-empty-cache", location=case.location)
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
            advice.fix("profiling", "balance-workers", location=case.location)
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
            advice.fix("profiling", "bisect-backends", location=case.location),
            advice.fix("profiling", "compile-submodules"),
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
            advice.fix("profiling", "profile-window-first")
        ],
        [_profile_step(case)],
    )

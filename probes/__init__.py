"""Run-time instruments that live inside the user's process (`torchdoctor run`).

Importing this package does not import torch: the parent process reads the
probe table below to validate `--probe NAME` and to find each probe's
analysis. The instruments themselves (`torchdoctor.probes.<name>`) import
torch when the script does.

How a probe is built, how it is called and how to add one: see
`torchdoctor.probes.base` (the probe API).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeInfo:
    """One row of the probe table."""

    name: str  # what `--probe NAME` selects; also the key of its step-record fields
    instrument: str  # "module:Class" of the Probe subclass that runs inside the script's process
    analysis: str  # module with `analyse(run) -> Analysis`, run in the parent (no torch)
    measures: str  # one line for `torchdoctor run --help` and the docs
    cost: str  # what it costs, measured (see bench/bench_run.py)
    default: bool = True  # selected when no --probe is given
    # False: the instrument module imports no torch at module level and is
    # installed before the script starts; True: right after the script's own
    # `import torch` (the bootstrap never imports torch first).
    needs_torch: bool = True


PROBES: dict[str, ProbeInfo] = {
    p.name: p
    for p in (
        ProbeInfo(
            name="memory",
            instrument="torchdoctor.probes.memory:MemoryProbe",
            analysis="torchdoctor.analysis.memory",
            measures="RSS / CUDA allocator per step, live-tensor census, autograd-graph holders, peak breakdown, OOM",
            cost="~20-30 µs per step right after a CPU step (an RSS read, on short steps every few steps, within "
            "0.2% of the step); census and graph scans kept under 0.3% of step time after the first 40 steps",
        ),
        ProbeInfo(
            name="env",
            instrument="torchdoctor.probes.env:EnvProbe",
            analysis="torchdoctor.analysis.env",
            measures="torch / CUDA / cuDNN versions, device, TF32 and determinism flags, relevant environment variables",
            cost="about a millisecond, once at the first step and once at the end",
            needs_torch=False,
        ),
        ProbeInfo(
            name="nan",
            instrument="torchdoctor.probes.nan:NanProbe",
            analysis="torchdoctor.analysis.nan",
            measures="finite loss / gradients / parameters every step, per-layer gradient norms, GradScaler skips; "
            "the first bad module, op and line on the first NaN/Inf",
            cost="~15 µs per step for the loss and the input capture; the gradient check reads every gradient once "
            "(~70-110 µs per 0.4 M CPU parameters), every step unless that exceeds 1.5% of the step; a replay "
            "of one step, once, after a NaN",
        ),
        ProbeInfo(
            name="data",
            instrument="torchdoctor.probes.data:DataProbe",
            analysis="torchdoctor.analysis.data",
            measures="each DataLoader's settings and call site, and the time each step waits for its batches; "
            "loaders with workers built again every epoch",
            cost="~1 µs per batch (a wrapper around the loader iterator's __next__)",
        ),
        ProbeInfo(
            name="profile",
            instrument="torchdoctor.probes.profile:ProfileProbe",
            analysis="torchdoctor.analysis.profile",
            measures="torch.profiler over a short window of steps: Perfetto trace, step split (data / forward / "
            "backward / optimizer / other), top operators, host syncs with their lines, CPU/GPU utilisation",
            cost="nothing outside its window of 5 steps; inside it ~1-2 µs per operator, then ~0.1-0.5 s to summarise",
        ),
        ProbeInfo(
            name="compile",
            instrument="torchdoctor.probes.compile:CompileProbe",
            analysis="torchdoctor.analysis.compile",
            measures="torch.compile graph breaks (reason, user line) and recompilations (the failing guard), "
            "from dynamo's logs and counters; --compile-backend eager makes detection fast on CPU",
            cost="none until dynamo logs a break or a recompile; a regular expression per record",
        ),
        # The training-protocol probes (issue 6): thin wrappers around what the script calls.
        ProbeInfo(
            name="schedule",
            instrument="torchdoctor.probes.schedule:ScheduleProbe",
            analysis="torchdoctor.analysis.schedule",
            measures="each LR scheduler's kind and planned length, scheduler.step() calls per optimizer step, "
            "a step before the first optimizer.step(); the intended and the projected LR curves",
            cost="< 1 µs per optimizer step, ~2 µs per scheduler.step(); the curve replayed once at the end",
        ),
        ProbeInfo(
            name="amp",
            instrument="torchdoctor.probes.amp:AmpProbe",
            analysis="torchdoctor.analysis.amp",
            measures="autocast regions entered (device, dtype), float16 backward without a GradScaler, clipping "
            "before unscale_, a scaler with bfloat16, the loss scale and skipped steps",
            cost="~1 µs per autocast region and per GradScaler call, < 1 µs per backward",
        ),
        ProbeInfo(
            name="accumulation",
            instrument="torchdoctor.probes.accumulation:AccumulationProbe",
            analysis="torchdoctor.analysis.accumulation",
            measures="backward passes per optimizer step, the constant the loss is divided by, gradient norms "
            "after one and after all micro-steps, micro-steps thrown away or left over, gradients never cleared "
            "between optimizer steps",
            cost="< 1 µs per backward and per step; a loss-graph walk on sampled backwards, a norm on 3 steps",
        ),
        ProbeInfo(
            name="validation",
            instrument="torchdoctor.probes.validation:ValidationProbe",
            analysis="torchdoctor.analysis.validation",
            measures="top-level forwards no backward reaches: grad mode, dropout/batch-norm train mode, the memory "
            "their graph holds, model.train() not restored",
            cost="~10 µs per top-level forward in a tight loop, 30-40 µs right after a CPU step; nothing per layer",
        ),
        ProbeInfo(
            name="checkpoint",
            instrument="torchdoctor.probes.checkpoint:CheckpointProbe",
            analysis="torchdoctor.analysis.checkpoint",
            measures="what each torch.save holds (weights, optimizer, scheduler, scaler, epoch/step, RNG; whole "
            "modules; module. prefixes), torch.load settings, load_state_dict missing/unexpected keys",
            cost="nothing per step; a walk over the top two levels of each saved or loaded object",
        ),
        ProbeInfo(
            name="gradcheck",
            instrument="torchdoctor.probes.gradcheck:GradcheckProbe",
            analysis="torchdoctor.analysis.gradcheck",
            measures="each custom autograd.Function of the script: its inputs at first use, then "
            "torch.autograd.gradcheck on double-precision inputs once, after the run",
            cost="< 1 µs per Function.apply; gradcheck once per Function after the run (reported apart)",
        ),
        ProbeInfo(
            name="gradflow",
            instrument="torchdoctor.probes.gradflow:GradflowProbe",
            analysis="torchdoctor.analysis.gradflow",
            measures="parameters no gradient reaches (frozen, cut off by .detach()/.numpy(), never used, in no "
            "optimizer), a loss that stays exactly constant, probabilities fed to a loss that takes logits",
            cost="< 1 µs per backward, ~0.1 µs per parameter on checked steps; one localising forward if needed",
        ),
        ProbeInfo(
            name="distributed",
            instrument="torchdoctor.probes.distributed:DistributedProbe",
            analysis="torchdoctor.analysis.distributed",
            measures="DDP checks in every torchrun rank: DistributedSampler epochs, parameters without gradients, "
            "torch.save on every rank, gradient syncs per optimizer step, .expand() of parameters, per-rank step "
            "times, a parameter checksum per rank on sampled steps; inert without torchrun",
            cost="~1.5 µs per DDP forward and ~0.3 µs per step; the first DDP forward is watched once (a few µs "
            "per operator); nothing in a single-process run",
        ),
    )
}


def names() -> list[str]:
    """Every probe name, in table order."""
    return list(PROBES)


def defaults() -> list[str]:
    """The probes a run gets when no --probe is given."""
    return [p.name for p in PROBES.values() if p.default]

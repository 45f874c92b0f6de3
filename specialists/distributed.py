"""Distributed training: DDP/FSDP setup, torchrun, NCCL/gloo, hangs, samplers, rank-0 duties.

The fixes themselves are data (rules/data/advice/distributed.toml); this module decides which apply,
in which order, which line each is pinned to, and fills in what the evidence names (the script, the
model's variable).
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case, Specialist
from torchdoctor.specialists.units import count, listing, secs

SPECIALIST = Specialist("distributed")


def _hang_cmd(case: Case) -> str:
    return f"torchdoctor run --nproc-per-node 2 --hang-timeout 30 {case.script}"


def _debug_env_step(case: Case) -> str:
    return (
        f"`TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --nproc-per-node 2 {case.script}` makes DDP check that every "
        "rank calls the same collectives with the same shapes and names unused parameters; on GPUs add "
        "`NCCL_DEBUG=INFO` for NCCL's own log."
    )


def _flight_recorder_step(case: Case) -> str:
    return (
        "On NCCL, keep a record of the last collectives per rank and dump it on timeout: "
        f"`TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 torchrun --nproc-per-node 2 {case.script}` "
        "(TORCH_NCCL_TRACE_BUFFER_SIZE is the older name of the buffer setting), then `torchfrtrace <dump dir>` "
        "shows the first collective the ranks disagree on."
    )


def _rank_list(case: Case) -> str:
    ranks = case.names("ranks")
    if len(ranks) > 1:
        return ", ".join(ranks[:-1]) + " and " + ranks[-1]
    return ranks[0] if ranks else ""


def _same_collectives_fix(case: Case) -> Fix:
    return advice.fix("distributed", "same-collectives-in-order", location=case.location,
                      hang_cmd=_hang_cmd(case))


def _hang_fixes(case: Case) -> list[Fix]:
    """A hang or a collective mismatch: same collectives first, then uneven data, then a timeout."""
    return [_same_collectives_fix(case), advice.fix("distributed", "even-batches-or-join"),
            advice.fix("distributed", "collective-timeout")]


@SPECIALIST.handles("ddp-hang")
def ddp_hang(case: Case) -> Advice:
    seconds = case.num("seconds")
    timeout_ms = case.num("timeout_ms")
    collective = case.text("collective", "op_type")
    seq = case.num("seq_num")
    stuck = case.text("stuck_in")
    ranks = _rank_list(case)
    where = case.at()
    if ranks:
        facts = f"{'Ranks' if len(case.names('ranks')) > 1 else 'Rank'} {ranks} stopped making progress"
    elif case.rank is not None:
        facts = f"Rank {case.rank} stopped making progress"
    else:
        facts = "The ranks stopped making progress"
    if seconds is not None:
        facts += f" (no optimizer step for {secs(seconds)})"
    elif timeout_ms is not None:
        facts += f" (the collective timed out after {secs(timeout_ms / 1000)})"
    if collective and seq is not None:
        collective = f"{collective} #{seq:.0f}"
    if collective:
        facts += f", waiting in `{collective}`"
    elif stuck:
        facts += f", blocked in `{stuck}` outside any collective"
    if where:
        facts += f" at {where}"
    facts += "."
    if stuck and not collective:
        facts += " Ranks stuck outside collectives point at data loading, a lock, or one rank waiting for a file another writes."
    elif not collective:
        facts += (
            " Usually one rank skipped or added a collective (a rank guard, a data-dependent branch, an extra "
            "batch) and the others wait for it; sometimes a rank is stuck outside any collective (data loading, a lock)."
        )
    return Advice(
        facts,
        _hang_fixes(case),
        [f"`{_hang_cmd(case)}` names, for each rank, the collective and the line it is stuck at.", _debug_env_step(case), _flight_recorder_step(case)],
    )


@SPECIALIST.handles("collective-mismatch")
def collective_mismatch(case: Case) -> Advice:
    calls = case.names("calls")
    where = case.at()
    op, other_op = case.text("op_type"), case.text("other_op_type")
    if not calls and op and other_op:
        me = f"rank {case.rank}" if case.rank is not None else "one rank"
        other = f"rank {case.num('other_rank'):.0f}" if case.num("other_rank") is not None else "another rank"
        seq, other_seq = case.num("seq_num"), case.num("other_seq_num")
        shape, other_shape = case.dims("tensor_shape"), case.dims("other_tensor_shape")
        calls = [
            f"{me} runs {op}" + (f" #{seq:.0f}" if seq is not None else "") + (f" on {shape}" if shape else ""),
            f"{other} runs {other_op}" + (f" #{other_seq:.0f}" if other_seq is not None else "")
            + (f" on {other_shape}" if other_shape else ""),
        ]
    if calls:
        facts = "The ranks are in different collectives: " + "; ".join(calls[:6]) + "."
    else:
        facts = "The ranks call different collectives, or the same ones in a different order"
        facts += f" (first divergence at {where})." if where else "."
    facts += " Each waits for a partner call that never comes."
    return Advice(
        facts,
        _hang_fixes(case),
        [_debug_env_step(case), f"`{_hang_cmd(case)}` reports each rank's collective and line.", _flight_recorder_step(case)],
    )


@SPECIALIST.handles("rank-crashed")
def rank_crashed(case: Case) -> Advice:
    rank = case.rank
    code = case.num("exit_code", "exitcode")
    error = case.text("error")
    signal = case.text("signal")
    peer = case.text("peer")
    after_last = case.value("after_last_step") is True
    who = f"Rank {rank}" if rank is not None else "One rank"
    facts = f"{who} exited"
    if code is not None:
        facts += f" with code {code:.0f}"
    if signal:
        facts += f" ({signal})"
    if error:
        facts += f" after `{error}`"
    if case.step is not None:
        facts += f" at step {case.step}"
    if peer and rank is None:
        facts = f"The connection to {peer} was reset: that rank exited"
    facts += "; the other ranks wait in their next collective for a partner that is gone."
    remote = case.value("remote_ranks")
    if case.value("lost_peer") is True and remote:
        # one node of a multi-node job: this rank saw its partner go away; the cause is on another node
        others = (f"rank {remote[0]} runs on another node" if len(remote) == 1
                  else f"ranks {listing(remote)} run on other nodes")
        facts = (f"{who} lost its connection to another rank" + (f" at step {case.step}" if case.step is not None
                 else "") + (f" (`{error}`)" if error else "") + f": {others}, where the job failed first. Read "
                 "that node's report (its --out directory) for the failing rank's error and line.")
    if after_last:
        facts = (
            f"{who} aborted at process exit, after its last training step and its own last output"
            + (f" ({signal})" if signal else "")
            + ": training itself completed. The torch 2.13 CPU (gloo) build shows such aborts at interpreter shutdown."
        )
    fixes = [
        advice.fix("distributed", "record-errors-per-rank", location=case.location),
        advice.fix("distributed", "collective-timeout"),
        advice.fix("distributed", "destroy-process-group"),
    ]
    if after_last:
        fixes.insert(0, fixes.pop())
    return Advice(
        facts,
        fixes,
        [f"`{_hang_cmd(case)}` reports which rank died first, with its exit code and last error."],
    )


@SPECIALIST.handles("unused-parameters")
def unused_parameters(case: Case) -> Advice:
    params = case.names("unused_parameters", "parameters", "param")
    n = case.num("count")
    indices = case.names("unused_parameter_indices", "param_index")
    what = listing(params) if params else "Some parameters"
    if not params and indices:
        what = f"Parameters with indices {listing(indices)}"
    facts = f"{what} received no gradient in a DDP step"
    if n is not None and not params:
        facts = f"{count(n, 'parameter')} received no gradient in a DDP step"
    facts += (
        ". DDP waits for a gradient from every parameter before its last all-reduce: without "
        "find_unused_parameters it raises 'Expected to have finished reduction in the prior iteration' at the next "
        "forward, and if the unused set differs between ranks they can hang instead."
    )
    where = case.at()
    if where:
        facts += f" The branch that skips them is at {where}."
    return Advice(
        facts,
        [
            advice.fix("distributed", "use-or-freeze-parameters", location=case.location),
            advice.fix("distributed", "static-graph"),
            advice.fix("distributed", "find-unused-parameters"),
        ],
        [_debug_env_step(case), f"`{_hang_cmd(case)}` names the parameters without gradients after each backward."],
    )


@SPECIALIST.handles("sampler-epoch-not-set")
def sampler_epoch(case: Case) -> Advice:
    epochs = case.num("epochs")
    calls = case.num("set_epoch_calls")  # measured: set_epoch can run and still pass the same epoch every time
    where = case.at("The epoch loop")
    if calls:
        facts = f"{where} calls sampler.set_epoch {count(calls, 'time')}, always with the same epoch"
    else:
        facts = f"{where} never calls sampler.set_epoch(epoch)"
    if epochs is not None:
        facts += f": the DistributedSampler produced the same order in all {count(epochs, 'epoch')}"
    facts += ": its shuffle is seeded by the epoch number, so without it every epoch repeats the same order."
    if calls:  # set_epoch runs, with a constant: the fix is the argument, not the call
        fix = advice.fix("distributed", "set-epoch-argument", location=case.location)
    else:
        fix = advice.fix("distributed", "set-epoch-every-epoch", location=case.location)
    return Advice(
        facts,
        [fix],
        [f"`{case.check_cmd(case.rule_code('TD3'))}` checks epoch loops over DistributedSamplers."],
    )


@SPECIALIST.handles("save-on-all-ranks")
def save_on_all_ranks(case: Case) -> Advice:
    ranks = case.num("ranks_saving")
    path = case.text("path")
    where = case.at("The checkpoint code")
    facts = f"{where} writes the checkpoint from {case.text('runs_on') or 'every rank'}"
    if ranks is not None:
        facts = f"{where} writes the checkpoint from {count(ranks, 'rank')}"
    if path:
        facts += f" to `{path}`"
    facts += ": concurrent writes to one path can leave a corrupt file, and N copies cost N times the I/O."
    return Advice(
        facts,
        [
            advice.fix("distributed", "save-on-rank-0", location=case.location),
        ],
        [f"`{case.run_cmd(extra='--nproc-per-node 2 --steps 20')}` records which ranks call torch.save."],
    )


@SPECIALIST.handles("wrapped-state-dict-saved")
def wrapped_state_dict_saved(case: Case) -> Advice:
    variable = case.text("variable") or "model"
    wrapper = case.text("wrapper") or "DDP"
    where = case.at("The checkpoint code")
    return Advice(
        f"{where} saves `{variable}.state_dict()` from the {wrapper} wrapper: every key gets the `module.` "
        "prefix, so the file loads only into an identically wrapped model.",
        [
            advice.fix("distributed", "save-module-state-dict", location=case.location, variable=variable),
            advice.fix("distributed", "strip-module-prefix"),
        ],
        [f"`{case.check_cmd('TD304')}` finds every place that saves the wrapper's state_dict."],
    )


@SPECIALIST.handles("accumulation-without-no-sync")
def accumulation_no_sync(case: Case) -> Advice:
    micro = case.num("micro_steps")
    reduces = case.num("allreduces_per_step")
    where = case.at("The accumulation loop")
    facts = f"{where} all-reduces gradients on every micro-step"
    if reduces is not None:
        facts = f"{where} runs {count(reduces, 'gradient all-reduce')} per optimizer step"
        if micro is not None:
            facts += f" ({count(micro, 'micro-step')})"
    facts += ": only the last one is needed, the rest is communication the step waits for."
    return Advice(
        facts,
        [
            advice.fix("distributed", "no-sync-accumulation", location=case.location)
        ],
        [f"`{case.run_cmd('profile', extra='--nproc-per-node 2 --steps 20')}` counts all-reduces per optimizer step."],
    )


@SPECIALIST.handles("ddp-ranks-diverged")
def ranks_diverged(case: Case) -> Advice:
    step = case.num("diverged_at_step")
    unsynced = case.num("unsynced_steps")
    facts = "The DDP replicas no longer hold the same parameters"
    if step is not None:
        facts += f" (they differ after step {step:.0f})"
    if unsynced is not None:
        facts += f"; {count(unsynced, 'optimizer step')} applied a gradient no all-reduce had reached"
    where = case.at()
    if where:
        facts += f", the last backward before such a step at {where}"
    facts += ". Each rank now trains its own model, and what rank 0 saves is one of them."
    return Advice(
        facts,
        [
            advice.fix("distributed", "micro-steps-through-wrapper", location=case.location)
        ],
        [f"`{case.run_cmd('distributed', extra='--nproc-per-node 2 --steps 20')}` compares the ranks' parameters."],
    )


@SPECIALIST.handles("grad-sync-misplaced")
def grad_sync_misplaced(case: Case) -> Advice:
    where = case.at("The micro-step loop")
    model = case.text("variable") or "model"
    effect = case.text("effect")
    facts = (f"{where} switches DDP's gradient sync after the forward of the micro-step: DDP decided in that forward "
             "whether the backward all-reduces, ")
    if effect:
        facts += f"so {effect}."
    else:
        facts += ("so the last micro-step (the one that must sync the sum) does not, the first one does, and each "
                  "rank steps with its own gradients. The replicas drift apart without an error.")
    return Advice(
        facts,
        [
            advice.fix("distributed", "no-sync-around-forward", location=case.location, model=model),
            advice.fix("distributed", "require-sync-before-forward", location=case.location, model=model),
        ],
        [f"`{case.run_cmd('profile', extra='--nproc-per-node 2 --steps 20')}` counts the all-reduces per "
         "optimizer step: one, on the last micro-step, when the sync is placed right."],
    )


@SPECIALIST.handles("expand-in-forward")
def expand_in_forward(case: Case) -> Advice:
    where = case.at("The forward")
    return Advice(
        f"{where} uses .expand() on a parameter or buffer under DDP. That alone is fine: expand's backward sums the "
        "gradient back to the parameter's shape, so DDP reduces an ordinary dense gradient (also with "
        "gradient_as_bucket_view=True or static_graph=True). It only matters if the expanded view is written in "
        "place, stored as a parameter or buffer, or handed to a collective.",
        [
            advice.fix("distributed", "clone-before-writing", location=case.location),
            advice.fix("distributed", "no-expanded-buffers"),
            advice.fix("distributed", "contiguous-for-collectives"),
        ],
        [
            "Keep .expand() for read-only broadcasting: it allocates nothing, while .repeat() copies the data.",
            f"`{case.check_cmd(case.rule_code('TD3'))}` lists expand calls in DDP forwards and whether they are written to.",
        ],
    )


@SPECIALIST.handles("straggler")
def straggler(case: Case) -> Advice:
    rank = case.rank
    slowdown = case.num("slowdown")
    median_ms = case.num("median_step_ms")
    who = f"Rank {rank}" if rank is not None else "One rank"
    facts = f"{who} is consistently slower than the others"
    if slowdown is not None:
        facts += f" ({slowdown:.2f}x the median step"
        facts += f" of {median_ms:.0f} ms)" if median_ms is not None else ")"
    facts += "; every all-reduce waits for it, so the whole job runs at its pace."
    return Advice(
        facts,
        [
            advice.fix("distributed", "rank-0-extras-out-of-step", location=case.location),
            advice.fix("distributed", "balance-work-per-rank"),
            advice.fix("distributed", "check-slow-rank-hardware"),
        ],
        [f"`{case.run_cmd('profile', extra='--nproc-per-node 2 --steps 30')}` compares per-rank step splits."],
    )


@SPECIALIST.handles("shuffle-with-sampler")
def shuffle_with_sampler(case: Case) -> Advice:
    where = case.at("The DataLoader")
    return Advice(
        f"{where} passes shuffle=True together with a sampler: the DataLoader raises 'sampler option is mutually "
        "exclusive with shuffle'. The sampler decides the order.",
        [
            advice.fix("distributed", "shuffle-in-sampler", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD3'))}` checks every DataLoader with a sampler."],
    )


@SPECIALIST.handles("cuda-device-not-set")
def cuda_device_not_set(case: Case) -> Advice:
    where = case.at("The setup")
    facts = (
        f"{where} creates an NCCL process group without torch.cuda.set_device(local_rank): every rank starts on "
        "cuda:0, so GPU 0 runs out of memory or NCCL sees duplicate GPUs and hangs or errors."
    )
    if case.rank is not None and case.num("other_rank") is not None:
        device = case.text("device", "gpu_index")
        facts = (
            f"Ranks {case.rank} and {case.num('other_rank'):.0f} use the same GPU"
            + (f" ({device})" if device else "")
            + ": each rank must be bound to its own device with torch.cuda.set_device(local_rank)."
        )
    return Advice(
        facts,
        [
            advice.fix("distributed", "set-device-per-rank", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD3'))}` checks the process-group setup."],
    )


@SPECIALIST.handles("distributed-setup")
def distributed_setup(case: Case) -> Advice:
    return Advice(
        "Start with DDP launched by torchrun: one process per GPU, a DistributedSampler with set_epoch, rank 0 "
        "saving and logging; move to FSDP only when the model, gradients and optimizer state do not fit on one GPU.",
        [
            advice.fix("distributed", "ddp-skeleton", script=case.script),
            advice.fix("distributed", "launch-with-torchrun", script=case.script),
        ],
        [f"`torchdoctor run --nproc-per-node 2 --steps 20 {case.script}` checks samplers, saves, unused parameters and hangs."],
    )


@SPECIALIST.handles("nccl-error")
def nccl_error(case: Case) -> Advice:
    err = case.text("nccl_error")
    version = case.text("nccl_version")
    facts = "An NCCL call failed"
    if err:
        facts += f" ({err}"
        facts += f", NCCL {version})" if version else ")"
    if case.rank is not None:
        facts += f" on rank {case.rank}"
    facts += (
        ": a remote peer that exited shows up here too, so check whether another rank crashed first; otherwise "
        "it is the network transport or the setup."
    )
    return Advice(
        facts,
        [
            advice.fix("distributed", "nccl-debug-log", script=case.script),
            advice.fix("distributed", "nccl-socket-ifname", script=case.script),
            advice.fix("distributed", "collective-timeout"),
        ],
        [f"`{_hang_cmd(case)}` tells a crashed peer from a transport failure.", _flight_recorder_step(case)],
    )


@SPECIALIST.handles("distributed-init-failed")
def init_failed(case: Case) -> Advice:
    variable = case.text("variable")
    port = case.num("port")
    host = case.text("host")
    waiting = case.value("waiting_for_nodes") is True  # this node's agent waited for nodes that never joined
    if variable:
        facts = f"init_process_group found no {variable} in the environment: the script was started without torchrun"
    elif waiting:
        endpoint = case.text("endpoint")
        facts = (f"No rank started: this node's torchrun agent waited {secs(case.num('seconds') or 0)} at the "
                 f"rendezvous{' ' + endpoint if endpoint else ''} for the job's other nodes (--nnodes "
                 f"{case.text('nnodes')}), and they never joined: start the same command on every node, each with its "
                 "own --node-rank and this endpoint, and check that every node reaches it")
    elif port is not None and "store-port-in-use" in case.sources:
        facts = f"Port {port:.0f} is already in use: another job (or a leftover process) holds the rendezvous port"
    elif port is not None:
        facts = f"Ranks could not reach the rendezvous store at {host or 'the master host'}:{port:.0f} in time"
    elif "process-group-not-initialized" in case.sources:
        facts = "A torch.distributed call ran before init_process_group"
    else:
        facts = "The process group could not start"
    facts += "."
    multi_node = advice.fix("distributed", "multi-node-endpoint", script=case.script)
    fixes = [multi_node] if waiting else [  # a node left alone: only the rendezvous matters
        advice.fix("distributed", "torchrun-sets-environment", location=case.location, script=case.script),
        multi_node,
        advice.fix("distributed", "init-before-collectives"),
    ]
    return Advice(
        facts,
        fixes,
        [f"`torchdoctor run --nproc-per-node 2 --steps 5 {case.script}` launches through torchrun with the right environment."],
    )


_MEMORY_IDS = {"oom", "high-memory", "memory-growth", "fragmentation"}
_SPEED_IDS = {"slow-step", "low-gpu-util", "dataloader-bound", "host-sync", "launch-bound"}
_NAN_IDS = {"nan-loss", "nonfinite-grad", "exploding-gradients", "loss-scale-collapse"}


@SPECIALIST.general
def general(case: Case) -> Advice:
    sid = case.symptom.id
    if sid in _MEMORY_IDS:
        return Advice(
            "Under distributed training, check the setup before per-GPU memory: every rank must be on its own GPU, "
            "and DDP keeps a full copy of the model, gradients and optimizer state on each one.",
            [
                cuda_device_not_set(case).fixes[0],
                advice.fix("distributed", "shard-with-fsdp"),
                advice.fix("distributed", "gradient-as-bucket-view"),
            ],
            [f"`torchdoctor run --nproc-per-node 2 --probe memory --steps 5 {case.script}` measures each rank's peak."],
        )
    if sid in _SPEED_IDS:
        return Advice(
            "From the distributed side: once the single-GPU step is efficient, check how much of the step is "
            "gradient communication and whether one rank holds the others back.",
            [accumulation_no_sync(case).fixes[0]],
            [f"`{case.run_cmd('profile', extra='--nproc-per-node 2 --steps 20')}` reports per-rank step times and all-reduces."],
        )
    if sid in _NAN_IDS:
        return Advice(
            "Under DDP a non-finite gradient on one rank is averaged into every rank's gradient by the all-reduce: "
            "find the first rank and step where it appears, not only where it shows.",
            [
                advice.fix("distributed", "check-loss-per-rank", location=case.location)
            ],
            [f"`torchdoctor run --nproc-per-node 2 --probe nan --steps 200 {case.script}` reports the rank and step of the first non-finite value."],
        )
    return Advice(
        "From the distributed side: make sure every rank runs the same code path, on its own device, with its own shard of data.",
        [_same_collectives_fix(case)],
        [_debug_env_step(case)],
    )

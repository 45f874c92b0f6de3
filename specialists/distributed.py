"""Distributed training: DDP/FSDP setup, torchrun, NCCL/gloo, hangs, samplers, rank-0 duties."""

from __future__ import annotations

from torchdoctor.model import Fix
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
    return Fix(
        title="Make every rank run the same collectives in the same order",
        snippet=(
            "loss_sum = torch.tensor([val_loss], device=device)\n"
            "dist.all_reduce(loss_sum)            # every rank, outside any `if rank == 0`\n"
            "if dist.get_rank() == 0:\n"
            "    print(loss_sum.item() / dist.get_world_size())   # only the printing is rank-specific"
        ),
        why="A collective completes only when every rank calls it; one under a rank guard, in a data-dependent "
        "branch or in a loop of different length on each rank leaves the others waiting for ever.",
        verify=f"`{_hang_cmd(case)}` completes without a hang report.",
        location=case.location,
    )


def _uneven_fix() -> Fix:
    return Fix(
        title="Give every rank the same number of batches, or join uneven inputs",
        snippet=(
            "sampler = DistributedSampler(ds, drop_last=True)   # equal shards\n"
            "# or let ranks that run out shadow the others' collectives:\n"
            "with model.join():\n"
            "    for x, y in loader:\n"
            "        ..."
        ),
        why="A rank with one extra batch runs one extra backward (one extra all-reduce) that nobody answers.",
        verify="len(loader) is equal on every rank, or the job finishes with join().",
        applies_when="Ranks see different amounts of data (custom samplers, filtering, variable-size shards).",
    )


def _timeout_fix() -> Fix:
    return Fix(
        title="Turn silent hangs into errors with a collective timeout",
        snippet=(
            "from datetime import timedelta\n"
            "dist.init_process_group(backend='nccl', timeout=timedelta(minutes=5))"
        ),
        why="With a shorter timeout the NCCL watchdog aborts the stuck collective and reports it instead of "
        "waiting out the default (10 minutes for NCCL, 30 for gloo); TORCH_NCCL_ASYNC_ERROR_HANDLING controls what happens then "
        "(the old NCCL_ASYNC_ERROR_HANDLING name is deprecated).",
        verify="A hang now ends with a timeout error naming the collective and its sequence number.",
        applies_when="Pick a timeout longer than your slowest legitimate step (e.g. checkpoint saving on rank 0).",
    )


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
        [_same_collectives_fix(case), _uneven_fix(), _timeout_fix()],
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
        [_same_collectives_fix(case), _uneven_fix(), _timeout_fix()],
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
        Fix(
            title="Read that rank's own traceback: record errors per rank",
            snippet=(
                "from torch.distributed.elastic.multiprocessing.errors import record\n\n"
                "@record\n"
                "def main():\n"
                "    ...\n\n"
                "if __name__ == '__main__':\n"
                "    main()"
            ),
            why="torchrun then writes the failing rank's exception to an error file and prints it in its summary, "
            "instead of only the other ranks' timeouts.",
            verify="torchrun's failure summary names the rank, its exception and its line.",
            location=case.location,
        ),
        _timeout_fix(),
        Fix(
            title="Shut the process group down cleanly",
            snippet="try:\n    main()\nfinally:\n    if dist.is_initialized():\n        dist.destroy_process_group()",
            why="An explicit destroy flushes and closes communicators before interpreter teardown.",
            verify="No abort messages after the last step.",
            applies_when="The crash happens at exit, after training finished.",
        ),
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
            Fix(
                title="Fix the model: use every parameter, or freeze the ones you skip before wrapping",
                snippet=(
                    "for p in model.aux_head.parameters():   # not used in this phase\n"
                    "    p.requires_grad_(False)\n"
                    "model = DDP(model, device_ids=[local_rank])"
                ),
                why="DDP only waits for parameters that require grad; removing or freezing dead parameters costs "
                "nothing per step.",
                verify="No unused-parameter report; the DDP error does not recur.",
                location=case.location,
            ),
            Fix(
                title="Declare a static graph when the unused set never changes",
                snippet="model = DDP(model, device_ids=[local_rank], static_graph=True)",
                why="DDP records which parameters are used in the first iteration and skips them from then on, "
                "without a graph traversal per step.",
                verify="Training runs without the error and at the same speed.",
                applies_when="Only when the same parameters are unused on every step and every rank.",
            ),
            Fix(
                title="Last resort: find_unused_parameters=True",
                snippet="model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)",
                why="DDP then traverses the autograd graph from the outputs on every step to mark unused parameters "
                "ready: correct for changing control flow, but slower on every step.",
                verify="The error is gone; compare steps per second with and without it.",
                applies_when="The set of unused parameters really changes from step to step.",
            ),
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
    return Advice(
        facts,
        [
            Fix(
                title="Pass the loop's epoch number to set_epoch" if calls else "Call set_epoch at the start of every epoch",
                snippet="for epoch in range(start_epoch, epochs):\n    sampler.set_epoch(epoch)\n    for x, y in loader:\n        ...",
                why="The sampler shuffles with seed + epoch; all ranks use the same value, so shards stay disjoint.",
                verify="The first batch's indices differ between epochs (and agree across ranks on the permutation).",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD3'))}` checks epoch loops over DistributedSamplers."],
    )


@SPECIALIST.handles("save-on-all-ranks")
def save_on_all_ranks(case: Case) -> Advice:
    ranks = case.num("ranks_saving")
    path = case.text("path")
    where = case.at("The checkpoint code")
    facts = f"{where} writes the checkpoint from every rank"
    if ranks is not None:
        facts = f"{where} writes the checkpoint from {count(ranks, 'rank')}"
    if path:
        facts += f" to `{path}`"
    facts += ": concurrent writes to one path can leave a corrupt file, and N copies cost N times the I/O."
    return Advice(
        facts,
        [
            Fix(
                title="Save on rank 0, then let the others wait for the file",
                snippet=(
                    "if dist.get_rank() == 0:\n"
                    "    torch.save({'model': model.module.state_dict(), 'optimizer': optimizer.state_dict(),\n"
                    "                'epoch': epoch}, path)\n"
                    "dist.barrier()   # every rank, so nobody reads a half-written file"
                ),
                why="DDP keeps identical replicas, so one copy is complete; model.module avoids the 'module.' key prefix.",
                verify="One file per checkpoint; loading it into an unwrapped model works with strict=True.",
                location=case.location,
            ),
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
            Fix(
                title="Save the wrapped module's state_dict, on rank 0",
                snippet=(
                    f"raw_model = {variable}.module   # the model DDP wraps\n"
                    "if dist.get_rank() == 0:\n"
                    "    torch.save({'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict()}, path)"
                ),
                why="DDP registers your model as its submodule `module`; its own state_dict is the same "
                "tensors under longer names.",
                verify="`torch.load(path)['model']` loads into a plain, unwrapped model with strict=True.",
                location=case.location,
            ),
            Fix(
                title="For checkpoints already written: strip the prefix when loading",
                snippet=(
                    "from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present\n"
                    "state = torch.load(path, map_location='cpu', weights_only=True)\n"
                    "consume_prefix_in_state_dict_if_present(state, 'module.')\n"
                    "model.load_state_dict(state)"
                ),
                why="The parameters are right; only their names differ.",
                verify="load_state_dict reports no missing or unexpected keys.",
            ),
        ],
        [f"`{case.check_cmd('TD304')}` finds every place that saves the wrapper's state_dict."],
    )


_NO_SYNC = """\
from contextlib import nullcontext

for i, (x, y) in enumerate(loader):
    last_micro = (i + 1) % accum_steps == 0
    with nullcontext() if last_micro else model.no_sync():
        loss = criterion(model(x), y) / accum_steps
        loss.backward()            # all-reduces only on the last micro-step
    if last_micro:
        optimizer.step()
        optimizer.zero_grad()"""


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
            Fix(
                title="Skip the all-reduce with model.no_sync() on all but the last micro-step",
                snippet=_NO_SYNC,
                why="Inside no_sync() DDP accumulates gradients locally; the next backward outside it reduces the sum once.",
                verify="One all-reduce round per optimizer step; the gradients equal the synced version.",
                location=case.location,
            )
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
            Fix(
                title="Run every micro-step through the DDP wrapper; skip the all-reduce only with no_sync()",
                snippet=_NO_SYNC,
                why="DDP decides at the forward whether that backward all-reduces: the wrapper must be called "
                "(not `model.module`), and `require_backward_grad_sync` set before the forward, not after it. "
                "no_sync() on all but the last micro-step does both right.",
                verify="The ranks' parameter checksums stay equal (`torchdoctor run --nproc-per-node 2` compares them).",
                location=case.location,
            )
        ],
        [f"`{case.run_cmd('distributed', extra='--nproc-per-node 2 --steps 20')}` compares the ranks' parameters."],
    )


@SPECIALIST.handles("grad-sync-misplaced")
def grad_sync_misplaced(case: Case) -> Advice:
    where = case.at("The micro-step loop")
    model = case.text("variable") or "model"
    return Advice(
        f"{where} switches DDP's gradient sync after the forward of the micro-step: DDP decided in that forward "
        "whether the backward all-reduces, so the last micro-step (the one that must sync the sum) does not, the "
        "first one does, and each rank steps with its own gradients. The replicas drift apart without an error.",
        [
            Fix(
                title="Decide the sync before the forward: no_sync() around forward and backward",
                snippet=f"for micro_step in range(accum):\n    last = micro_step == accum - 1\n"
                f"    with contextlib.nullcontext() if last else {model}.no_sync():\n"
                f"        loss = criterion({model}(x), y) / accum\n        loss.backward()\noptimizer.step()",
                why="DDP prepares the reducer in forward; no_sync() covers both halves of the micro-step.",
                verify="After a few steps, a parameter's checksum is identical on every rank "
                "(all_gather of p.sum() for one parameter).",
                location=case.location,
            ),
            Fix(
                title=f"Or set {model}.require_backward_grad_sync before the forward",
                snippet=f"{model}.require_backward_grad_sync = micro_step == accum - 1\n"
                f"loss = criterion({model}(x), y) / accum\nloss.backward()",
                why="The flag works when it is set before the forward it is meant for.",
                verify="One all-reduce per optimizer step, on the last micro-step.",
                location=case.location,
            ),
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
            Fix(
                title="Copy before writing: .clone() (or .repeat()) only where the view is modified",
                snippet=(
                    "pos = self.pos_embed.expand(x.shape[0], -1, -1)           # read-only use: keep expand\n"
                    "x = x + pos\n"
                    "mask = self.mask.expand(b, -1).clone()                    # written below: materialise\n"
                    "mask[:, 0] = 0"
                ),
                why="An in-place write into an expanded view fails ('more than one element of the written-to tensor "
                "refers to a single memory location', or 'a view of a leaf Variable that requires grad is being "
                "used in an in-place operation'); if only some ranks take that branch, the others hang in the next "
                "all-reduce.",
                verify="No in-place op touches the expanded tensor; the forward runs on every rank.",
                location=case.location,
            ),
            Fix(
                title="Never register an expanded tensor as a parameter or buffer",
                snippet="self.register_buffer('pe', pe.expand(n, -1).contiguous())   # or keep the small tensor and expand in forward",
                why="DDP broadcasts parameters and buffers from rank 0 into each rank's tensors at construction; "
                "writing into a stride-0 tensor raises the overlapping-memory error.",
                verify="DDP(model) constructs without error.",
            ),
            Fix(
                title="Make tensors contiguous before passing them to a collective",
                snippet="t = t.contiguous()\ndist.all_reduce(t)",
                why="NCCL rejects non-contiguous tensors ('Tensors must be contiguous'); with gloo on CPU an expanded "
                "tensor was written past its storage in our test (memory corruption).",
                verify="Collectives receive t.is_contiguous() == True tensors.",
                applies_when="Only for tensors you pass to torch.distributed calls yourself.",
            ),
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
            Fix(
                title="Keep rank-0 extras out of the step",
                snippet="if step % log_every == 0 and dist.get_rank() == 0:\n    log_metrics(metrics)   # cheap, infrequent; no evaluation or saving inside the step",
                why="Logging, evaluation or checkpointing on one rank inside the step delays every rank's next all-reduce.",
                verify="Per-rank step times in the report converge.",
                location=case.location,
            ),
            Fix(
                title="Balance the work per rank",
                snippet="sampler = DistributedSampler(ds, shuffle=True, drop_last=True)\n"
                "# with variable-length samples: bucket by length so every rank gets similar sizes",
                why="Ranks with longer sequences or more samples per step take longer.",
                verify="Tokens (or samples) per step are similar on every rank.",
            ),
            Fix(
                title="Check the slow rank's hardware",
                snippet="nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,power.draw --format=csv -l 5",
                why="A throttled or differently-linked GPU slows one rank persistently.",
                verify="Clocks and temperature match across GPUs.",
                applies_when="The same rank is slow across runs with identical data.",
            ),
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
            Fix(
                title="Shuffle in the sampler, not the DataLoader",
                snippet="sampler = DistributedSampler(ds, shuffle=True)\nloader = DataLoader(ds, batch_size=64, sampler=sampler)",
                why="DistributedSampler shuffles per epoch (with set_epoch) and shards the indices across ranks.",
                verify="The DataLoader constructs; each rank sees a different shard.",
                location=case.location,
            )
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
            Fix(
                title="Bind each rank to its GPU before init_process_group",
                snippet=(
                    "local_rank = int(os.environ['LOCAL_RANK'])\n"
                    "torch.cuda.set_device(local_rank)\n"
                    "dist.init_process_group(backend='nccl', device_id=torch.device('cuda', local_rank))\n"
                    "model = DDP(model.to(local_rank), device_ids=[local_rank])"
                ),
                why="set_device makes 'cuda' mean this rank's GPU for every later allocation and for NCCL's communicator.",
                verify="nvidia-smi shows one process per GPU with similar memory.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD3'))}` checks the process-group setup."],
    )


@SPECIALIST.handles("distributed-setup")
def distributed_setup(case: Case) -> Advice:
    return Advice(
        "Start with DDP launched by torchrun: one process per GPU, a DistributedSampler with set_epoch, rank 0 "
        "saving and logging; move to FSDP only when the model, gradients and optimizer state do not fit on one GPU.",
        [
            Fix(
                title="A complete DDP skeleton",
                snippet=(
                    "import os\nimport torch\nimport torch.distributed as dist\n"
                    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                    "from torch.utils.data import DataLoader, DistributedSampler\n\n"
                    "local_rank = int(os.environ['LOCAL_RANK'])\n"
                    "torch.cuda.set_device(local_rank)\n"
                    "dist.init_process_group('nccl')\n"
                    "model = DDP(Net().cuda(), device_ids=[local_rank])\n"
                    "sampler = DistributedSampler(ds, shuffle=True)\n"
                    "loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=4, pin_memory=True)\n"
                    "for epoch in range(epochs):\n"
                    "    sampler.set_epoch(epoch)\n"
                    "    for x, y in loader:\n"
                    "        ...\n"
                    "    if dist.get_rank() == 0:\n"
                    "        torch.save(model.module.state_dict(), f'ckpt_{epoch}.pt')\n"
                    "    dist.barrier()\n"
                    "dist.destroy_process_group()"
                ),
                why="Each piece prevents a classic failure: wrong GPU, repeated data order, corrupt or prefixed checkpoints.",
                verify=f"`torchrun --nproc-per-node 2 {case.script}` trains and writes one checkpoint per epoch.",
            ),
            Fix(
                title="Launch with torchrun (multi-node: same command on every node)",
                snippet=(
                    f"torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d "
                    f"--rdzv-endpoint node0:29500 --rdzv-id job1 {case.script}"
                ),
                why="torchrun sets RANK, LOCAL_RANK and WORLD_SIZE and restarts or tears down workers together.",
                verify="Every rank prints the same WORLD_SIZE and a distinct RANK.",
                applies_when="The rendezvous flags are needed only for several nodes.",
            ),
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
            Fix(
                title="Read NCCL's own log",
                snippet=f"NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET torchrun --nproc-per-node 2 {case.script}",
                why="NCCL logs which interfaces and transports it picked and the system call that failed.",
                verify="The log names the failing transport (socket, InfiniBand, P2P/NVLink) and the peer.",
            ),
            Fix(
                title="Pin the network interface NCCL uses",
                snippet=f"NCCL_SOCKET_IFNAME=eth0 torchrun --nnodes 2 --nproc-per-node 8 {case.script}",
                why="On hosts with several interfaces (docker0, lo, VPNs) NCCL may pick one the peers cannot reach.",
                verify="The INFO log shows the intended interface; the error is gone.",
                applies_when="Multi-node jobs; use the interface name `ip addr` shows for the cluster network.",
            ),
            _timeout_fix(),
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
    return Advice(
        facts,
        [fix for fix in [
            Fix(
                title="Launch with torchrun, which sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous",
                snippet=f"torchrun --standalone --nproc-per-node 2 {case.script}",
                why="init_process_group() with the default env:// method reads these variables; --standalone also picks a free port.",
                verify="Every rank prints a distinct dist.get_rank() and the same world size.",
                location=case.location,
            ),
            Fix(
                title="Multi-node: one reachable endpoint, same command on every node",
                snippet=f"torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29500 --rdzv-id job1 {case.script}",
                why="All nodes must reach the endpoint's host and port (firewalls, the right interface).",
                verify="`nc -z node0 29500` succeeds from every node while the job starts.",
                applies_when="Several machines.",
            ),
            Fix(
                title="Initialise before any collective or DDP wrap",
                snippet="dist.init_process_group(backend='nccl' if torch.cuda.is_available() else 'gloo')\nmodel = DDP(model)",
                why="DDP and every dist.* call need the default process group.",
                verify="dist.is_initialized() is True before the first collective.",
            ),
        ] if not waiting or fix.title.startswith("Multi-node")],  # a node left alone: only the rendezvous matters
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
                Fix(
                    title="Shard instead of replicating: FSDP (fully_shard) or a sharded optimizer",
                    snippet=(
                        "from torch.distributed.fsdp import fully_shard\n"
                        "for block in model.blocks:\n    fully_shard(block)\nfully_shard(model)"
                    ),
                    why="FSDP splits parameters, gradients and optimizer state across ranks, so per-GPU memory falls "
                    "roughly with the number of GPUs.",
                    verify="Per-rank peak memory (torch.cuda.max_memory_allocated) drops by about the world size for the sharded parts.",
                    applies_when="Parameters + gradients + optimizer state, not activations, fill the GPU.",
                ),
                Fix(
                    title="Let DDP gradients share the all-reduce buckets",
                    snippet="model = DDP(model, device_ids=[local_rank], gradient_as_bucket_view=True)",
                    why="Gradients become views into the communication buckets instead of a second copy.",
                    verify="Peak memory after the first iteration drops by about the size of the gradients.",
                ),
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
                Fix(
                    title="Check the loss on each rank before backward",
                    snippet=(
                        "if not torch.isfinite(loss):\n"
                        "    print(f'rank {dist.get_rank()}: non-finite loss at step {step}', flush=True)"
                    ),
                    why="Before backward each rank's loss is still its own; after the all-reduce every gradient is "
                    "poisoned and the origin is lost.",
                    verify="Exactly one rank (or every rank) reports first, which tells data from model.",
                    location=case.location,
                )
            ],
            [f"`torchdoctor run --nproc-per-node 2 --probe nan --steps 200 {case.script}` reports the rank and step of the first non-finite value."],
        )
    return Advice(
        "From the distributed side: make sure every rank runs the same code path, on its own device, with its own shard of data.",
        [_same_collectives_fix(case)],
        [_debug_env_step(case)],
    )

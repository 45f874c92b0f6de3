"""Cross-rank classification of a distributed run (every run with more than one rank).

The runner calls this for every multi-rank run, whether or not the
`distributed` instrument ran: how the job ended and where ranks hung need
only the runner's own evidence (start/step/exit/process-exit events and the
ranks' stacks, analysis/ranks.py).

How it ended (one symptom, on the rank it is about):

- rank-crashed      the first rank that failed (analysis/ranks.py: exception,
                    non-zero exit, fatal signal, SIGKILL), when the others did
                    not fail the same way on their own: its exit code, signal,
                    error and step; the other ranks' ends as more evidence.
                    A rank that aborted in interpreter shutdown after every
                    rank finished its script is `info` with
                    `after_last_step=true`: the run completed.
- collective-mismatch / ddp-hang / rank-crashed after a hang (no optimizer
                    step on any rank for --hang-timeout) or after torchdoctor
                    stopped ranks waiting for a failed peer, from each rank's
                    stack: ranks in different collectives or at different
                    lines -> collective-mismatch on each of them; a rank that
                    had exited or failed while the others waited ->
                    rank-crashed; ranks stuck outside any collective (data
                    loading, a lock, a sleep) -> ddp-hang with `stuck_in`;
                    all in the same collective at the same line -> ddp-hang.
- collective-mismatch from TORCH_DISTRIBUTED_DEBUG=DETAIL's "Detected
                    mismatch between collectives" errors (--ddp-debug).

DDP checks, from the instrument's events (probes/distributed.py), each raised
once on the lowest rank that showed it, with every such rank in `ranks`:

- sampler-epoch-not-set  two passes of a shuffling DistributedSampler with the
                         same epoch
- unused-parameters      parameters that require grad without a gradient after
                         backward (error without find_unused_parameters, when
                         DDP raises at the next forward; info with it: it works,
                         at the cost of a graph traversal per step)
- save-on-all-ranks      torch.save at one line on two or more ranks (info when
                         every rank writes its own file)
- accumulation-without-no-sync  a median of >= `min_syncs_per_step` DDP
                         forwards with gradient sync per optimizer step
- expand-in-forward      .expand() of a parameter in a DDP forward (info)
- straggler              one rank's own work per step (data + forward, before
                         the all-reduce) >= `straggler_slowdown` x the others'
                         on >= `straggler_share` of >= `straggler_min_steps` steps

Thresholds: rules/data/thresholds.toml [distributed].
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.ranks import (
    Blocked,
    RankEnd,
    first_failure,
    lost_to_remote,
    rank_ends,
    remote_ranks,
    where_ranks_wait,
)
from torchdoctor.analysis.source import sync_switch_line
from torchdoctor.analysis.stacks import format_thread
from torchdoctor.model import Evidence, Location, RunError, Symptom
from torchdoctor.probes.userframes import display_path

PROBE = "distributed"
_MISMATCH = re.compile(
    r"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is running collective: "
    r"CollectiveFingerPrint\(SequenceNumber=(?P<seq>\d+),?\s*OpType=(?P<op>\w+)(?:, TensorShape=(?P<shape>\[[^\]]*\]))?"
)


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    if run.world_size <= 1 and len(run.ranks) <= 1:
        return out
    out.contexts.append("distributed")
    backend = _backend(run)
    if backend == "nccl":
        out.contexts.append("gpu")
    ends = rank_ends(run)
    facts = {"backend": backend} if backend else {}
    out.measurements = _measurements(run, ends, backend)
    out.symptoms += _how_it_ended(run, ends, facts)
    out.symptoms += _ddp_debug_mismatch(run, facts)
    out.symptoms += _straggler(run, facts)
    out.symptoms += _sampler_epoch(run, facts)
    out.symptoms += _unused_parameters(run, facts)
    out.symptoms += _saves(run, facts)
    out.symptoms += _accumulation(run, facts)
    out.symptoms += _diverged(run, facts)
    out.symptoms += _expand(run, facts)
    if _peer_stop(run) is not None:
        for rank in run.ranks:
            path = run.file("stacks", ".txt", rank)
            if path.exists():
                out.artifacts["stacks" if rank == 0 else f"stacks.rank{rank}"] = display_path(str(path), run.cwd)
    return out


def first_error(run: RunEvidence) -> RunError | None:
    """The run's error: the exception of the rank that failed first, not of the lowest rank."""
    first = first_failure(rank_ends(run))
    if first is None or first.exception is None:
        return None
    event = first.exception
    frame = event.get("user_frame") or {}
    where = run.location(frame["path"], frame.get("line"), frame.get("function")) if frame.get("path") else None
    return RunError(type=event.get("type", "Exception"), message=event.get("message", ""), location=where,
                    step=event.get("step"))


# -- facts --------------------------------------------------------------------------------


def _backend(run: RunEvidence) -> str | None:
    for event in run.of_kind("ddp-setup", PROBE):
        return event.get("backend")
    return None


def _has_ddp(run: RunEvidence) -> dict[int, bool]:
    return {rank: bool(run.of_kind("ddp-model", PROBE, rank)) for rank in run.ranks}


def _peer_stop(run: RunEvidence) -> int | None:
    return run.options.get("distributed", {}).get("peer_failed")


def _step_series(run: RunEvidence, rank: int) -> dict[int, float]:
    """step -> the rank's own time before the gradient all-reduce (ms), or the step interval without DDP."""
    steps = run.steps(rank)
    local = {int(e["step"]): float(e[PROBE]["local_ms"]) for e in steps
             if isinstance(e.get(PROBE), dict) and isinstance(e[PROBE].get("local_ms"), (int, float))}
    if local:
        return local
    return {int(b["step"]): (float(b["t"]) - float(a["t"])) * 1e3 for a, b in zip(steps, steps[1:], strict=False)}


def _median_interval_ms(run: RunEvidence, rank: int) -> float | None:
    steps = run.steps(rank)
    times = [float(b["t"]) - float(a["t"]) for a, b in zip(steps, steps[1:], strict=False)]
    return round(statistics.median(times) * 1e3, 3) if times else None


def _measurements(run: RunEvidence, ends: dict[int, RankEnd], backend: str | None) -> dict[str, Any]:
    per_rank = []
    for rank in run.ranks:
        end = ends.get(rank)
        local = list(_step_series(run, rank).values()) if run.of_kind("ddp-model", PROBE, rank) else []
        row: dict[str, Any] = {
            "rank": rank,
            "steps": run.steps_completed(rank),
            "step_time_median_ms": _median_interval_ms(run, rank),
            "local_time_median_ms": round(statistics.median(local), 3) if local else None,
            "end": end.kind if end else "unknown",
        }
        if end is not None:
            row.update(exit_code=end.status if end.status is not None else end.code, signal=end.signal,
                       after_last_step=end.after_last_step, host=end.host)
        per_rank.append(row)
    times = ", ".join(f"rank {r['rank']} {r['step_time_median_ms']:.1f} ms" for r in per_rank
                      if r["step_time_median_ms"] is not None)
    summary = f"{run.world_size} ranks" + (f" ({backend})" if backend else "")
    if len(run.ranks) < run.world_size:
        summary += f", evidence of {len(run.ranks)} here (the other nodes keep their own)"
    if times:
        summary += f"; step time (median) {times}"
    return {"world_size": run.world_size, "backend": backend, "ranks": per_rank, "summary": summary}


# -- how the job ended ---------------------------------------------------------------------


def _how_it_ended(run: RunEvidence, ends: dict[int, RankEnd], facts: dict[str, Any]) -> list[Symptom]:
    outcome = run.outcome
    if outcome.stopped == "hang" or _peer_stop(run) is not None:
        return _stuck(run, ends, facts)
    if outcome.stopped in ("timeout", "interrupted"):
        return []  # the user's limit or Ctrl-C ended the ranks: nobody failed
    first = first_failure(ends)
    if first is not None:
        if _mismatch_error(first) or _shared_failure(first, ends):
            return []
        return [_crashed(run, first, ends, facts)]
    return [_crashed(run, end, ends, facts, severity="info") for end in ends.values() if end.after_last_step]


def _shared_failure(first: RankEnd, ends: dict[int, RankEnd]) -> bool:
    """Every rank failed with the same error (DDP's unfinished-reduction error on all ranks): no one rank died."""
    if first.kind != "exception" or len(ends) < 2:
        return False
    head = (first.error or "")[:60]
    return all(e.kind == "exception" and (e.error or "")[:60] == head for e in ends.values())


def _mismatch_error(end: RankEnd) -> bool:
    return bool(end.exception and "Detected mismatch between collectives" in (end.exception.get("message") or ""))


def _crashed(run: RunEvidence, end: RankEnd, ends: dict[int, RankEnd], facts: dict[str, Any],
             severity: str | None = None, waiting: dict[int, Blocked] | None = None) -> Symptom:
    where = _error_location(run, end)
    others = [e for r, e in sorted(ends.items()) if r != end.rank]
    values: dict[str, Any] = {
        **facts,
        "rank": end.rank,
        "exit_code": end.status if end.status is not None else end.code,
        "signal": end.signal,
        "error": end.error,
        "step": end.steps,
        "after_last_step": end.after_last_step,
        "first_failure": not end.after_last_step,
        "ranks": [end.rank],
    }
    if waiting:
        values["waiting_ranks"] = sorted(waiting)
    if end.after_last_step:
        summary = (f"Rank {end.rank} {end.describe()}, after its last optimizer step (step {end.steps}) and the "
                   "script's own last output; every rank finished its script")
    elif end.lost_peer and remote_ranks(ends):
        # one node of a multi-node job: the local rank only saw its partner go away
        summary = lost_to_remote(end, remote_ranks(ends))
        values.update(first_failure=False, lost_peer=True, remote_ranks=remote_ranks(ends))
    else:
        summary = (f"Rank {end.rank} failed first: it {end.describe()} after {end.steps} optimizer "
                   f"step{'' if end.steps == 1 else 's'}")
        if waiting:
            summary += f"; rank {_listing(sorted(waiting))} waited for it"
    evidence = []
    for other in others:
        if waiting and other.rank in waiting:
            evidence.append(_waiting_evidence(run, waiting[other.rank]))
        elif not end.after_last_step:
            later = ""
            if other.ended_at is not None and end.ended_at is not None and other.failed:
                later = f" {max(other.ended_at - end.ended_at, 0.0):.1f} s later"
            evidence.append(Evidence(kind="probe", source=PROBE, location=_error_location(run, other),
                                     summary=f"rank {other.rank} then {other.describe()}{later}"))
    return run.symptom("rank-crashed", probe=PROBE, summary=summary, values=values, location=where,
                       step=end.steps, rank=end.rank, severity=severity, evidence=evidence,
                       quote=(end.exception or {}).get("traceback"))


def _error_location(run: RunEvidence, end: RankEnd) -> Location | None:
    frame = (end.exception or {}).get("user_frame") or {}
    if not frame.get("path"):
        return None
    return run.location(frame["path"], frame.get("line"), frame.get("function"))


def _stuck(run: RunEvidence, ends: dict[int, RankEnd], facts: dict[str, Any]) -> list[Symptom]:
    """Classify a hang (or ranks left waiting for a failed one) from every rank's stack."""
    decided_at = run.options.get("distributed", {}).get("decided_at")
    peer = _peer_stop(run)
    dead = [e for e in ends.values()
            if e.rank == peer or (decided_at is not None and e.ended_at is not None and e.ended_at < decided_at
                                  and e.kind != "terminated")]
    waiting = where_ranks_wait(run, [r for r in run.ranks if r not in {e.rank for e in dead}], _has_ddp(run))
    common = {**facts, "seconds": run.outcome.seconds_without_step, "hang_timeout_s": run.outcome.hang_timeout_s}
    if dead:
        first = min(dead, key=lambda e: (e.ended_at or 0.0, e.rank))
        return [_crashed(run, first, ends, facts, waiting=waiting)]
    if not waiting:
        return [run.symptom("ddp-hang", probe=PROBE, rank=r, values={**common, "ranks": list(run.ranks)},
                            summary=f"Rank {r} made no optimizer step for {_secs(run)}; no stack could be taken")
                for r in run.ranks]
    in_collective = {r: b for r, b in waiting.items() if b.collective}
    calls = [_call(run, b) for _, b in sorted(waiting.items())]
    positions = {(b.collective, b.site()) for b in in_collective.values()}
    out: list[Symptom] = []
    if len(in_collective) >= 2 and len(positions) >= 2:
        for rank, blocked in sorted(in_collective.items()):
            values = {**common, "ranks": sorted(in_collective), "calls": calls, "collective": blocked.collective}
            out.append(run.symptom(
                "collective-mismatch", probe=PROBE, rank=rank, step=run.steps_completed(rank), values=values,
                location=_location(run, blocked), quote=format_thread(blocked.thread) if blocked.thread else None,
                summary=f"Rank {rank} waits in {blocked.collective} at {_at(run, blocked)} while "
                + "; ".join(c for c in calls if not c.startswith(f"rank {rank} ")),
                evidence=[_waiting_evidence(run, b) for r, b in sorted(waiting.items()) if r != rank],
            ))
        waiting = {r: b for r, b in waiting.items() if not b.collective}
    outside = {r: b for r, b in waiting.items() if not b.collective}
    stuck = outside or ({} if out else waiting)
    remote = remote_ranks(ends)  # one node of a multi-node job: the other ranks' stacks are on their nodes
    elsewhere = (f"; rank {remote[0]} runs on another node" if len(remote) == 1
                 else f"; ranks {_listing(remote)} run on other nodes") if remote else ""
    for rank, blocked in sorted(stuck.items()):
        values = {**common, "ranks": sorted(stuck), "calls": calls}
        if remote:
            values["remote_ranks"] = remote
        if blocked.collective:
            values["collective"] = blocked.collective
            what = f"waits in {blocked.collective} at {_at(run, blocked)}"
            what += f"{elsewhere}: that node's report says where" if remote else ", like every other rank"
        else:
            values["stuck_in"] = blocked.stuck_in
            what = f"is stuck outside any collective, in {blocked.stuck_in} at {_at(run, blocked)}{elsewhere}"
        nobody = "No rank on this node" if remote else "No rank"
        out.append(run.symptom(
            "ddp-hang", probe=PROBE, rank=rank, step=run.steps_completed(rank), values=values,
            location=_location(run, blocked), quote=format_thread(blocked.thread) if blocked.thread else None,
            summary=f"{nobody} made an optimizer step for {_secs(run)}: rank {rank} {what}",
            evidence=[_waiting_evidence(run, b) for r, b in sorted(waiting.items()) if r != rank and b.collective],
        ))
    return out


def _call(run: RunEvidence, blocked: Blocked) -> str:
    what = f"waits in {blocked.collective}" if blocked.collective else f"is stuck in {blocked.stuck_in}"
    return f"rank {blocked.rank} {what} at {_at(run, blocked)}"


def _waiting_evidence(run: RunEvidence, blocked: Blocked) -> Evidence:
    return Evidence(kind="probe", source=PROBE, summary=_call(run, blocked), location=_location(run, blocked),
                    quote=format_thread(blocked.thread) if blocked.thread else None,
                    values={"rank": blocked.rank, "collective": blocked.collective, "stuck_in": blocked.stuck_in})


def _location(run: RunEvidence, blocked: Blocked) -> Location | None:
    if blocked.frame is None:
        return None
    return run.location(*blocked.frame)


def _at(run: RunEvidence, blocked: Blocked) -> str:
    where = _location(run, blocked)
    if where is None:
        return "an unknown line"
    return f"{where.path}:{where.line}" + (f" (`{where.code}`)" if where.code else "")


def _secs(run: RunEvidence) -> str:
    seconds = run.outcome.seconds_without_step or run.outcome.hang_timeout_s
    return f"{seconds:.1f} s" if seconds else "a while"


def rendezvous_wait(run: RunEvidence) -> Symptom | None:
    """A distributed run stopped at --hang-timeout before any rank started: torchrun's agent was still in
    the rendezvous, most often waiting for nodes that never joined (not started, another endpoint, a
    firewall). None for any other run."""
    if run.outcome.stopped != "hang" or any(run.start(r) for r in run.ranks):
        return None
    meet = run.options.get("distributed", {})
    nnodes, endpoint = meet.get("nnodes"), meet.get("endpoint")
    if not nnodes and not endpoint:
        return None  # --standalone: the agent's own store on this host; nothing to wait for
    seconds = run.outcome.seconds_without_step or run.outcome.hang_timeout_s or 0.0
    where = f" at {endpoint}" if endpoint else ""
    summary = f"No rank started in {seconds:.1f} s: torchrun's agent on this node was still in the rendezvous{where}"
    many = nnodes is not None and nnodes.rpartition(":")[2] not in ("", "1")
    if many:
        summary += f", waiting for the job's other nodes to join (--nnodes {nnodes}"
        summary += f", this node's rank {meet['node_rank']})" if meet.get("node_rank") else ")"
    host, _, port = (endpoint or "").rpartition(":")
    node_rank = meet.get("node_rank")
    values: dict[str, Any] = {"seconds": round(seconds, 2), "nnodes": nnodes,
                              "node_rank": int(node_rank) if str(node_rank).isdigit() else None,
                              "endpoint": endpoint, "waiting_for_nodes": many}
    if host and port.isdigit():
        values.update(host=host, port=int(port))
    return run.symptom("distributed-init-failed", probe=PROBE, summary=summary, values=values, severity="error")


def _dims(shape: str | None) -> list[int]:
    """'[4, 1]' (as DDP's debug check prints a shape) -> [4, 1]: shapes travel as numbers."""
    return [int(d) for d in re.findall(r"-?\d+", shape or "")]


def _ddp_debug_mismatch(run: RunEvidence, facts: dict[str, Any]) -> list[Symptom]:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL's "Detected mismatch between collectives" errors -> collective-mismatch."""
    seen: dict[int, dict[str, Any]] = {}
    for rank in run.ranks:
        for event in run.of_kind("exception", rank=rank):
            m = _MISMATCH.search(event.get("message") or "")
            if m:
                frame = event.get("user_frame") or {}
                seen[rank] = {"op": m.group("op"), "seq": int(m.group("seq")), "shape": m.group("shape"),
                              "frame": frame, "rank": int(m.group("rank"))}
    out = []
    calls = []
    for rank, item in sorted(seen.items()):
        frame = item["frame"]
        at = f" at {display_path(frame['path'], run.cwd)}:{frame.get('line')}" if frame.get("path") else ""
        calls.append(f"rank {rank} runs {item['op']} #{item['seq']}" + (f" on {item['shape']}" if item["shape"] else "")
                     + at)
    for rank, item in sorted(seen.items()):
        others = [(r, o) for r, o in sorted(seen.items()) if r != rank]
        values = {**facts, "op_type": item["op"], "seq_num": item["seq"], "tensor_shape": _dims(item["shape"]),
                  "ranks": sorted(seen), "calls": calls, "debug": "TORCH_DISTRIBUTED_DEBUG=DETAIL"}
        if others:
            values.update(other_rank=others[0][0], other_op_type=others[0][1]["op"],
                          other_seq_num=others[0][1]["seq"], other_tensor_shape=_dims(others[0][1]["shape"]))
        frame = item["frame"]
        where = run.location(frame["path"], frame.get("line"), frame.get("function")) if frame.get("path") else None
        out.append(run.symptom("collective-mismatch", probe=PROBE, rank=rank, location=where, values=values,
                               summary=f"TORCH_DISTRIBUTED_DEBUG=DETAIL: rank {rank} runs {item['op']} "
                               f"#{item['seq']} while " + "; ".join(c for c in calls if not c.startswith(f"rank {rank} "))))
    return out


# -- DDP checks -----------------------------------------------------------------------------


def _straggler(run: RunEvidence, facts: dict[str, Any]) -> list[Symptom]:
    limits = run.limits(PROBE)
    slowdown = float(limits.get("straggler_slowdown", 1.3))
    extra_ms = float(limits.get("straggler_min_extra_ms", 2.0))
    share = float(limits.get("straggler_share", 0.7))
    min_steps = int(limits.get("straggler_min_steps", 8))
    series = {rank: _step_series(run, rank) for rank in run.ranks}
    common = sorted(set.intersection(*(set(s) for s in series.values()))) if series else []
    common = [k for k in common if k > 1]  # the first step pays one-off costs
    if len(series) < 2 or len(common) < min_steps:
        return []
    out = []
    for rank in run.ranks:
        ratios, slow = [], 0
        for step in common:
            mine = series[rank][step]
            others = statistics.median(series[r][step] for r in series if r != rank)
            ratios.append(mine / others if others > 0 else float("inf"))
            if mine >= slowdown * others and mine - others >= extra_ms:
                slow += 1
        if slow / len(common) < share:
            continue
        mine_ms = statistics.median(series[rank][k] for k in common)
        others_ms = statistics.median(series[r][k] for r in series if r != rank for k in common)
        values = {**facts, "slowdown": round(statistics.median(ratios), 2), "median_step_ms": _median_interval_ms(run, 0),
                  "local_step_ms": round(mine_ms, 3), "others_local_step_ms": round(others_ms, 3),
                  "steps_compared": len(common), "slow_share": round(slow / len(common), 2)}
        out.append(run.symptom(
            "straggler", probe=PROBE, rank=rank, values=values,
            summary=f"Rank {rank}'s own work per step (data and forward, before the all-reduce) took "
            f"{mine_ms:.1f} ms against {others_ms:.1f} ms on the other ranks ({values['slowdown']:.2f}x), slower on "
            f"{slow} of {len(common)} steps; every rank waits for it in the all-reduce"))
    return out


def _by_rank(run: RunEvidence, kind: str) -> dict[int, list[dict[str, Any]]]:
    return {rank: run.of_kind(kind, PROBE, rank) for rank in run.ranks if run.of_kind(kind, PROBE, rank)}


def _site(run: RunEvidence, event: dict[str, Any]) -> Location | None:
    if not event.get("path"):
        return None
    return run.location(event["path"], event.get("line"), event.get("function"))


def _sampler_epoch(run: RunEvidence, facts: dict[str, Any]) -> list[Symptom]:
    found: dict[int, tuple[dict[str, Any], int]] = {}
    for rank, events in _by_rank(run, "sampler-pass").items():
        passes: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
        for event in events:
            if event.get("shuffle"):
                passes[(event.get("sampler"), event.get("epoch"))].append(event)
        repeated = [group for group in passes.values() if len(group) >= 2]
        if repeated:
            group = max(repeated, key=len)
            found[rank] = (group[1], len(group))
    if not found:
        return []
    rank = min(found)
    event, count = found[rank]
    set_calls = int(event.get("set_epoch_calls") or 0)
    how = "set_epoch was never called" if not set_calls else f"set_epoch was called {set_calls} times with that value"
    values = {**facts, "epochs": count, "epoch": event.get("epoch"), "set_epoch_calls": set_calls,
              "ranks": sorted(found)}
    return [run.symptom(
        "sampler-epoch-not-set", probe=PROBE, rank=rank, step=event.get("step"), values=values,
        location=_site(run, event),
        summary=f"A shuffling DistributedSampler was iterated {count} times with epoch {event.get('epoch')} "
        f"({how}): every one of those epochs saw the same order, on rank {_listing(sorted(found))}")]


def _unused_parameters(run: RunEvidence, facts: dict[str, Any]) -> list[Symptom]:
    """One symptom per rank that saw it: it merges with that rank's DDP error from the signatures."""
    by_rank = _by_rank(run, "ddp-unused")
    checked = int(run.thresholds.get(PROBE, {}).get("instrument", {}).get("unused_check_steps", 3))
    out = []
    for rank, events in sorted(by_rank.items()):
        names: list[str] = []
        for event in events:
            names += [n for n in event.get("parameters", []) if n not in names]
        steps = sorted({int(e.get("step", 0)) + 1 for e in events})
        find_unused = bool(events[0].get("find_unused_parameters"))
        values = {**facts, "unused_parameters": names, "count": len(names), "ranks": sorted(by_rank),
                  "at_steps": steps, "steps_checked": min(checked, max(run.steps_completed(rank), 1)),
                  "find_unused_parameters": find_unused, "static_graph": bool(events[0].get("static_graph")),
                  "module": events[0].get("function")}
        when = f"after the backward of step {_listing(steps)}"
        if find_unused:
            summary = (f"{_listing(names[:8])} had no gradient {when}; find_unused_parameters=True keeps DDP "
                       "working at the cost of an autograd-graph traversal every step")
        else:
            summary = (f"{_listing(names[:8])} had no gradient {when}, in a DDP model without "
                       "find_unused_parameters: DDP raises 'Expected to have finished reduction in the prior "
                       "iteration' at the next forward")
        out.append(run.symptom("unused-parameters", probe=PROBE, rank=rank, step=steps[0], values=values,
                               location=_site(run, events[0]), summary=summary,
                               severity="info" if find_unused else None))
    return out


def _saves(run: RunEvidence, facts: dict[str, Any]) -> list[Symptom]:
    sites: dict[tuple[Any, Any], dict[int, list[dict[str, Any]]]] = defaultdict(dict)
    for rank, events in _by_rank(run, "save").items():
        for event in events:
            sites[(event.get("path"), event.get("line"))].setdefault(rank, []).append(event)
    out = []
    for ranks in sites.values():
        if len(ranks) < 2:
            continue
        first_rank = min(ranks)
        event = ranks[first_rank][0]
        files = {e.get("file") for events in ranks.values() for e in events}
        same = len({ranks[r][0].get("file") for r in ranks}) == 1
        values = {**facts, "ranks_saving": len(ranks), "world_size": run.world_size, "path": event.get("file"),
                  "same_file": same, "ranks": sorted(ranks), "save_calls": sum(len(v) for v in ranks.values())}
        summary = (f"torch.save ran on rank {_listing(sorted(ranks))} at the same line"
                   + (f", every rank writing {event.get('file')}" if same else f", into {len(files)} files"))
        out.append(run.symptom("save-on-all-ranks", probe=PROBE, rank=first_rank, step=event.get("step"),
                               values=values, location=_site(run, event), summary=summary,
                               severity=None if same else "info"))
    return out


def _accumulation(run: RunEvidence, facts: dict[str, Any]) -> list[Symptom]:
    need = int(run.limits(PROBE).get("min_syncs_per_step", 2))
    found: dict[int, tuple[float, float, int]] = {}
    for rank in run.ranks:
        rows = [e[PROBE] for e in run.steps(rank) if isinstance(e.get(PROBE), dict)]
        rows = [r for r in rows if r.get("micro")]
        if not rows:
            continue
        syncs = statistics.median(r.get("syncs", 0) for r in rows)
        micro = statistics.median(r.get("micro", 0) for r in rows)
        if syncs >= need:
            found[rank] = (syncs, micro, len(rows))
    if not found:
        return []
    rank = min(found)
    syncs, micro, steps = found[rank]
    site = run.of_kind("ddp-forward", PROBE, rank)
    values = {**facts, "allreduces_per_step": syncs, "micro_steps": micro, "steps": steps, "ranks": sorted(found)}
    return [run.symptom(
        "accumulation-without-no-sync", probe=PROBE, rank=rank, values=values,
        location=_site(run, site[0]) if site else None,
        summary=f"{syncs:g} of {micro:g} DDP forwards per optimizer step (median over {steps} steps) had gradient "
        "synchronisation on: each one all-reduces every gradient in its backward, where one per step is enough")]


def _diverged(run: RunEvidence, facts: dict[str, Any]) -> list[Symptom]:
    """Replicas that no longer agree: the ranks' parameter checksums after the same step differ, and the steps
    whose gradients no all-reduce reached (no synchronised DDP forward since the step before) say why."""
    lim = run.limits(PROBE)
    sums: dict[int, dict[int, float]] = {}
    for rank in run.ranks:
        for e in run.steps(rank):
            fields = e.get(PROBE)
            if isinstance(fields, dict) and isinstance(fields.get("checksum"), (int, float)):
                sums.setdefault(int(e["step"]), {})[rank] = float(fields["checksum"])
    tolerance = float(lim.get("checksum_tolerance", 1e-6))
    compared = [(step, by_rank) for step, by_rank in sorted(sums.items()) if len(by_rank) >= 2]
    apart = []
    for step, by_rank in compared:
        spread = max(by_rank.values()) - min(by_rank.values())
        if spread > tolerance * max(1.0, max(abs(x) for x in by_rank.values())):
            apart.append((step, spread))
    unsynced = {rank: run.of_kind("ddp-unsynced-step", PROBE, rank) for rank in run.ranks}
    unsynced = {rank: events for rank, events in unsynced.items() if events}
    if not apart:
        return []  # replicas measured equal (or never compared): nothing drifted
    first_step, spread = apart[0]
    values: dict[str, Any] = {**facts, "diverged_at_step": first_step, "checksum_spread": spread,
                              "steps_compared": len(compared), "steps_apart": len(apart),
                              "last_spread": apart[-1][1]}
    text = (f"the ranks' parameters differ after step {first_step} (a checksum of the same parameters on each rank "
            f"differs by {spread:.3g}; apart at {len(apart)} of {len(compared)} compared steps)")
    where = None
    rank = min(run.ranks)
    replaced = next((e for r in run.ranks for e in run.of_kind("ddp-replaced-parameter", PROBE, r)), None)
    local = _local_write(run)
    stepped = _scheduler_ranks(run)
    if replaced is not None:
        names = replaced.get("parameters") or []
        values.update(replaced_parameters=names)
        site = replaced.get("site")
        text += (f": parameter {_listing(names[:4])} of the DDP model is not the one DDP was built with"
                 + (f" (line {site.get('line')} assigned a new nn.Parameter after wrapping)" if site else "")
                 + ", so its gradient hooks are on the old parameter and the new one's gradient is never "
                 "all-reduced: each rank steps it on its own gradient")
        where = _site(run, site) if site else None
    elif unsynced:
        rank = min(unsynced)
        event = unsynced[rank][0]
        values.update(unsynced_steps=len(unsynced[rank]), first_unsynced_step=event.get("at_step"),
                      micro_steps=event.get("micro"))
        unwrapped = run.of_kind("ddp-unwrapped", PROBE, rank)
        if not event.get("micro"):
            how = "no forward through the DDP wrapper at all (the model used unwrapped)"
            if unwrapped:
                chosen = _unwrap_read(unwrapped, event)
                unwrapped = [chosen]
                taken = chosen["site"]
                how += f"; the script takes `.module` at line {taken.get('line')} (in {taken.get('function')})"
                caller = unwrapped[0].get("caller") or {}
                backward = event.get("site") or {}
                if caller.get("line") and (caller.get("path"), caller.get("function")) == (
                        backward.get("path"), backward.get("function")):
                    # a getter returned the inner model to the code that then ran this backward: that call is the
                    # one that trains around the wrapper (the getter may rightly serve saving too)
                    how += f", which line {caller.get('line')} calls to get the model it trains with"
                    event = {**event, "site": caller}
                else:
                    event = {**event, "site": taken}  # where the wrapper was left behind
            elif event.get("bypass"):
                # no `.module` read: a reference to the model kept from before wrapping, or one of its submodules,
                # called directly: that call trains around the wrapper
                bypass = event["bypass"]
                verb = "passes the unwrapped" if bypass.get("passes") else "calls the"
                tail = " to the code that calls it" if bypass.get("passes") else " directly"
                how += (f"; line {bypass.get('line')} (in {bypass.get('function')}) {verb} "
                        f"{event.get('bypass_module') or 'model'}{tail}, not through the DDP wrapper")
                event = {**event, "site": bypass}
        elif event.get("syncs"):
            how = (f"of its {event.get('micro')} micro-steps, the last ran with gradient synchronisation off, after "
                   "the all-reduce: its gradient stayed local")
        else:
            how = f"{event.get('micro')} backward passes, none after a DDP forward with gradient synchronisation on"
        backward = event.get("site") or {}
        if event.get("micro") and backward.get("path"):
            # DDP forwards ran with sync off: the line that switched it off is the fix, not the backward
            switch = sync_switch_line(backward["path"], backward.get("function"), backward.get("line"))
            entered = event.get("no_sync") or {}
            if switch is not None:
                how += f"; line {switch} turns `require_backward_grad_sync` off"
                event = {**event, "site": {**backward, "line": switch}}
            elif entered.get("line"):
                # the context was chosen where `no_sync()` was called (a helper may pick it): the toggle to fix
                did = "turns `require_backward_grad_sync` off" if entered.get("flag") else "calls `no_sync()`"
                how += f"; line {entered.get('line')} (in {entered.get('function')}) {did}, the last time before that step"
                event = {**event, "site": entered}
        text += (f": optimizer step {event.get('at_step')} applied a gradient no all-reduce had reached ({how}), so "
                 "each rank stepped on its own gradient")
        where = _site(run, event["site"]) if event.get("site") else None
    elif foreign := next((e for r in run.ranks for e in run.of_kind("ddp-foreign-forward", PROBE, r)), None):
        # the DDP model's gradients were all-reduced, but the optimizer also steps weights no wrapper owns
        site = foreign.get("site") or {}
        values.update(unwrapped_module=foreign.get("module"), unwrapped_parameters=foreign.get("parameters"))
        text += (f": the optimizer also steps {foreign.get('parameters')} parameter tensor(s) of "
                 f"{foreign.get('module')}, which belongs to no DDP model"
                 + (f" (called at line {site.get('line')}, in {site.get('function')})" if site.get("line") else "")
                 + ": their gradients are never all-reduced, so each rank steps them on its own gradient (wrap "
                 "that module with the model, or all-reduce its gradients)")
        where = _site(run, site) if site else None
    elif written := next((e for r in run.ranks for e in run.of_kind("ddp-parameter-write", PROBE, r)), None):
        # the gradients were all-reduced, but the forward itself wrote a parameter from this rank's own batch
        site = written.get("site") or {}
        values.update(written_parameter=written.get("parameter"))
        text += (f": the gradients were synchronised, but parameter {written.get('parameter')} of the DDP model is "
                 f"written in place inside its forward (`{written.get('op')}`"
                 + (f" at line {site.get('line')}, in {site.get('function')}" if site.get("line") else "")
                 + "), from each rank's own batch: DDP averages gradients only, so that update stays local "
                 "(all-reduce the update, or express it as a gradient)")
        where = _site(run, site) if site else None
    elif local and (local[1] is not None or not stepped):
        # the gradients were all-reduced, but the script wrote a parameter (or its gradient) in place outside the
        # forward and the optimizer's update: on one rank only, or from values each rank computed on its own
        event, only = local
        site = event.get("site") or {}
        part = "gradient of " if event.get("part") == "grad" else ""
        op = "through `.data`" if event.get("op") == "data" else f"(`{event.get('op')}`)"
        values.update(written_parameter=event.get("parameter"), written_part=event.get("part"),
                      written_on_ranks=only)
        where_text = f"line {site.get('line')}" + (f" (in {site.get('function')})" if site.get("function") else "")
        if only is not None:
            text += (f": the gradients were synchronised, but {where_text} writes the {part}parameter "
                     f"{event.get('parameter')} in place {op} on rank {_listing(only)} only, or "
                     "a different number of times there: a rank-dependent update the other replicas never make")
        else:
            text += (f": the gradients were synchronised, but {where_text} writes the {part}parameter "
                     f"{event.get('parameter')} in place {op} outside the forward and the "
                     "optimizer's update, from values each rank computes on its own (its batch, its random "
                     "generator): DDP averages gradients only, so that write stays local (all-reduce what it "
                     "uses, or broadcast the result)")
        where = _site(run, site) if site else None
    elif stepped:
        # the gradients were all-reduced, but a learning-rate scheduler stepped on some ranks only (or a different
        # number of times): the same gradient, a different step size on each rank
        counts, site = stepped
        values.update(scheduler_steps_by_rank=[counts.get(r, 0) for r in sorted(run.ranks)])
        said = ", ".join(f"{counts.get(r, 0)} on rank {r}" for r in sorted(run.ranks))
        text += (": the gradients were synchronised, but the learning-rate scheduler stepped a different number of "
                 f"times on each rank ({said}"
                 + (f"; line {site.get('line')}, in {site.get('function')}" if site.get("line") else "")
                 + "): the ranks apply the same gradient with different learning rates (step the scheduler on "
                 "every rank, outside the branch that logs on the main process)")
        where = _site(run, site) if site.get("path") else None
    else:
        text += ": the gradients were synchronised, so something else made the replicas differ (a rank-dependent "
        text += "update outside the optimizer, buffers, or a different initialisation)"
    return [run.symptom("ddp-ranks-diverged", probe=PROBE, rank=rank, values=values, location=where,
                        step=first_step, summary=text)]


def _unwrap_read(reads: list[dict[str, Any]], event: dict[str, Any]) -> dict[str, Any]:
    """Of the script's `.module` reads (each distinct line, in order), the one that trained around the wrapper:
    the read on the very line that called the inner model (`model.module(x)`), else the last read in the
    function of that call or of the unsynchronised backward before that step, else the first read. A read made
    elsewhere first (a parameter count, a print) is not the one."""
    step = event.get("at_step")
    before = [r for r in reads if r.get("at_step") is None or step is None or r["at_step"] <= step] or reads
    bypass = event.get("bypass") or {}
    backward = event.get("site") or {}
    for r in before:
        site = r.get("site") or {}
        if bypass.get("line") and (site.get("path"), site.get("line")) == (bypass.get("path"), bypass.get("line")):
            return r
    for anchor in (bypass, backward):
        if not anchor.get("function"):
            continue
        same = [r for r in before if ((r.get("site") or {}).get("path"), (r.get("site") or {}).get("function"))
                == (anchor.get("path"), anchor.get("function"))
                or ((r.get("caller") or {}).get("path"), (r.get("caller") or {}).get("function"))
                == (anchor.get("path"), anchor.get("function"))]
        if same:
            return same[-1]
    return before[0]


def _scheduler_ranks(run: RunEvidence) -> tuple[dict[int, int], dict[str, Any]] | None:
    """A scheduler (the schedule probe's `scheduler-end`, per index) stepped a different number of times on the
    ranks: the counts by rank, and the line of the rank that stepped most (the branch that runs it)."""
    by_index: dict[Any, dict[int, dict[str, Any]]] = {}
    for rank in run.ranks:
        for e in run.of_kind("scheduler-end", "schedule", rank):
            by_index.setdefault(e.get("index"), {})[rank] = e
    for ends in by_index.values():
        counts = {rank: int(e.get("steps") or 0) for rank, e in ends.items()}
        if len(ends) < 2 or len(set(counts.values())) < 2:
            continue
        most = max(counts, key=lambda r: counts[r])
        return counts, ends[most].get("step_site") or {}
    return None


def _local_write(run: RunEvidence) -> tuple[dict[str, Any], list[int] | None] | None:
    """The in-place write of the script that best explains replicas drifting apart while their gradients were
    synchronised (probes/distributed.py `ddp-local-write`): a line that wrote on some ranks and not on others
    (or a different number of times) first, the rank-dependent branch; else the first line that wrote a
    parameter's values, not its gradient (a gradient scaled the same way on every rank, a clip, changes nothing
    between them). With the ranks it wrote on when that differs, else None."""
    firsts: dict[tuple[Any, Any], dict[str, Any]] = {}
    counts: dict[tuple[Any, Any], dict[int, int]] = {}
    for rank in run.ranks:
        for e in run.of_kind("ddp-local-write", PROBE, rank):
            site = e.get("site") or {}
            key = (site.get("path"), site.get("line"))
            firsts.setdefault(key, e)
            counts.setdefault(key, {}).setdefault(rank, 1)
        for e in run.of_kind("ddp-local-writes", PROBE, rank):
            for site in e.get("sites") or []:
                key = (site.get("path"), site.get("line"))
                if key in counts:
                    counts[key][rank] = int(site.get("count") or 1)
    if not firsts:
        return None
    ranks = set(run.ranks)
    order = sorted(firsts, key=lambda k: (firsts[k].get("at_step") or 0))
    for key in order:
        by_rank = counts.get(key, {})
        if set(by_rank) != ranks or len(set(by_rank.values())) > 1:
            return firsts[key], sorted(by_rank)
    data = [k for k in order if firsts[k].get("part") != "grad"]
    return (firsts[data[0]], None) if data else None


def _expand(run: RunEvidence, facts: dict[str, Any]) -> list[Symptom]:
    by_rank = _by_rank(run, "ddp-expand")
    if not by_rank:
        return []
    rank = min(by_rank)
    events = by_rank[rank]
    names = list(dict.fromkeys(e.get("parameter") for e in events))
    values = {**facts, "parameters": names, "shapes": [e.get("shape") for e in events][:8], "ranks": sorted(by_rank)}
    return [run.symptom("expand-in-forward", probe=PROBE, rank=rank, step=events[0].get("step"), values=values,
                        location=_site(run, events[0]),
                        summary=f".expand() of parameter {_listing(names)} in the DDP model's forward")]


def _listing(items: list[Any]) -> str:
    words = [str(i) for i in items]
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]

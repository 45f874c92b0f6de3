"""Where gradients do not flow: parameters no gradient reaches, a cut graph, a loss that never moves.

Reads the gradflow probe's events (probes/gradflow.py): `gradflow-params`,
`gradless` and `gradflow-summary`. Thresholds: rules/data/thresholds.toml
[gradflow]. DDP runs are left to the distributed analysis (a parameter
without a gradient is a DDP error there, with its own symptom).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.sites import latest, location, plural
from torchdoctor.analysis.source import grad_off_line

PROBE = "gradflow"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        params = latest(run, PROBE, "gradflow-params", rank=rank)
        if params is not None and not params.get("ddp") and run.world_size == 1:
            _not_in_optimizer(run, rank, params, out)
            gradless = latest(run, PROBE, "gradless", rank=rank)
            if gradless is not None:
                _gradless(run, rank, params, gradless, out)
            if params.get("frozen_count") and rank == 0:
                out.notes.append(
                    f"{plural(params['frozen_count'], 'parameter')} in the optimizer "
                    f"{'has' if params['frozen_count'] == 1 else 'have'} requires_grad=False "
                    f"({', '.join(params['frozen_in_optimizer'][:4])}): frozen on purpose, they cost nothing."
                )
        _softmax_before_loss(run, rank, out)
        _detached_summand(run, rank, out)
        summary = latest(run, PROBE, "gradflow-summary", rank=rank)
        if summary is not None:
            _constant_loss(run, rank, summary, lim, out)
            if rank == 0:
                out.measurements = _measurements(params, summary)
    return out


def _softmax_before_loss(run: RunEvidence, rank: int, out: Analysis) -> None:
    """A softmax's probabilities reached the log_softmax of cross_entropy (or nll_loss with no log at all)."""
    events = run.of_kind("softmax-before-loss", PROBE, rank)
    if not events:
        return
    event = events[0]
    made = "exp(log_softmax(...))" if event.get("made_by") == "ExpBackward0" else "a softmax"
    if event.get("loss_op") == "nll_loss":
        text = (f"the loss's nll_loss takes the output of {made} directly: it expects log-probabilities, so the "
                "loss is -p instead of -log p")
    else:
        text = (f"the output of {made} reached the log_softmax inside the loss (cross_entropy applies its own): "
                "the probabilities are squashed a second time, the gradients shrink and training stalls; "
                "pass the raw scores (logits)")
    where = event.get("site")
    if where is None:
        text += "; the softmax's line was not seen (the loss's backward is named instead)"
    values = {"loss_op": event.get("loss_op"), "made_by": event.get("made_by"), "step": event.get("at_step")}
    out.symptoms.append(
        run.symptom("softmax-before-loss", probe=PROBE, summary=text, values=values,
                    location=location(run, where or event.get("backward_site")), rank=rank)
    )


def _detached_summand(run: RunEvidence, rank: int, out: Analysis) -> None:
    """A term of the loss made a constant by detach()/.data, cut from parameters the next optimizer step updates."""
    events = run.of_kind("detached-summand", PROBE, rank)
    if not events:
        return
    event = events[0]
    site = dict(event.get("site") or {})
    if event.get("cut") == "no_grad" and site.get("path"):
        # computed with autograd off: the `with torch.no_grad():` (or decorator) around the op, or around the call
        # of the helper that ran it, when written there
        for frame in event.get("stack") or [site]:
            off = grad_off_line(frame.get("path") or "", frame.get("line"))
            if off is not None:
                site = {**frame, "line": off}
                break
    where = location(run, site or None)
    # the op that cut it: detach()/.data, or an integer copy / argmax() of a value with a graph (`cut`)
    by = ("an op under `torch.no_grad()`" if event.get("cut") == "no_grad" else f"`{event['cut']}`"
          if event.get("cut") else "detach()/.data")
    cut = f"({by}{f' on line {where.line}' if where and where.line else ''})"
    reached = plural(event.get("parameters_reached", 0), "parameter")
    if event.get("through"):
        text = (f"a term of the loss backpropagated at step {event.get('at_step')} ran a detached tensor {cut} "
                f"through {event['through']}, a network the optimizer that then steps does not train: no gradient "
                f"flows back through that input to the {reached} of that optimizer it was cut from (as in a "
                "generator loss computed on D(fake.detach()))")
    elif event.get("rebuilt_leaf"):
        how = f"`{event['cut']}`" if event.get("cut") else "detach()/.data"
        text = (f"a term of the loss backpropagated at step {event.get('at_step')} was computed from a copy of a "
                f"tensor with a graph cut by {how}{f' on line {where.line}' if where and where.line else ''}, that the "
                "script then made a leaf requiring grad: the term's gradient ends at that new leaf, while the graph "
                f"it was cut from reaches {reached} of the optimizer that then steps; this term trains none of them "
                "(the rest of the loss still does)")
    else:
        what = "a tensor cut from its graph" if event.get("cut") else "a detached tensor"
        text = (f"a term of the loss backpropagated at step {event.get('at_step')} was computed from {what} "
                f"{cut} and added to the loss as a constant: the graph it was cut from reaches {reached} of "
                "the optimizer that then steps, and this term trains none of them (the rest of the loss still does)")
    values = {"step": event.get("at_step"), "parameters_reached": event.get("parameters_reached"),
              "optimizer_parameters": event.get("optimizer_parameters"), "detached_from": event.get("node"),
              "through": event.get("through"), "cut": event.get("cut"), "rebuilt_leaf": event.get("rebuilt_leaf"),
              "site_count": len(events)}
    out.symptoms.append(run.symptom("non-differentiable", probe=PROBE, summary=text, values=values, location=where,
                                    step=event.get("at_step"), rank=rank))


def _not_in_optimizer(run: RunEvidence, rank: int, params: dict[str, Any], out: Analysis) -> None:
    names = params.get("not_in_optimizer") or []
    if not names:
        return
    n = int(params.get("not_in_optimizer_count") or len(names))
    out.symptoms.append(
        run.symptom(
            "frozen-parameters",
            probe=PROBE,
            summary=f"{plural(n, 'parameter')} of the model ({', '.join(names[:4])}{', …' if n > 4 else ''}) "
            "receive gradients but belong to no optimizer that steps: they never change",
            values={"parameters": names, "count": n, "cause": "not in any optimizer"},
            step=params.get("step"),
            rank=rank,
        )
    )


def _gradless(run: RunEvidence, rank: int, params: dict[str, Any], gradless: dict[str, Any], out: Analysis) -> None:
    checks = params.get("checks")
    cut = gradless.get("cut") or []
    if cut:
        names = [p for c in cut for p in c["parameters"]]
        call = gradless.get("call")
        modules = ", ".join(c["module"] for c in cut[:3])
        text = (f"{plural(len(names), 'trainable parameter')} of {modules} got no gradient in {plural(checks, 'step')} "
                f"although {'that module runs' if len(cut) == 1 else 'those modules run'} with autograd recording: "
                "the graph is cut between them and the loss")
        values: dict[str, Any] = {"parameters": names, "count": len(names), "modules": [c["module"] for c in cut]}
        where = None
        if call and call.get("how"):
            # the parameters themselves were used where no graph records them, inside the model or its helper
            values["op"] = call["op"]
            site = dict(call.get("site") or {})
            how = call["how"]
            off = grad_off_line(site["path"], site.get("line")) if how == "no_grad" and site.get("path") else None
            if off is not None:
                site["line"] = off
            where = location(run, site)
            line = f" on line {where.line}" if where and where.line else ""
            text = (f"{plural(len(names), 'trainable parameter')} of {modules} got no gradient in "
                    f"{plural(checks, 'step')}")
            if how == "no_grad":
                text += (f": their values are read with autograd off (`{call['op']}`" + (
                    f", under the `no_grad` of line {off}" if off is not None else line) + "), so the result is a "
                    "constant")
            elif how == "data":
                text += f": they are read through `.data`{line}, which no graph records"
            else:
                text += (f": a value computed from them is written into a parameter's storage (`{call['op']}`{line}) "
                         "through `.data` or under no_grad, where no graph records it")
        elif call:
            values["op"] = call["op"]
            where = location(run, call.get("site"))
            text += f", at `{call['op']}`" + (f" on line {where.line}" if where and where.line else "")
        elif gradless.get("dropped"):
            # nothing cut the graph: the values made from those modules went into a term no backward used
            dropped = gradless["dropped"]
            values["dropped_op"] = dropped.get("op")
            where = location(run, dropped.get("site"))
            text = (f"{plural(len(names), 'trainable parameter')} of {modules} got no gradient in "
                    f"{plural(checks, 'step')} although {'that module runs' if len(cut) == 1 else 'those modules run'} "
                    "with autograd recording and nothing detached their output: the values made from it last went "
                    f"into `{dropped.get('op')}`" + (f" on line {where.line}" if where and where.line else "")
                    + ", a result the backward did not use (a term computed and then left out of the loss)")
        out.symptoms.append(run.symptom("non-differentiable", probe=PROBE, summary=text, values=values,
                                        location=where, rank=rank))
    for key, cause, why in (
        ("unused", "module never runs in the forward", "the modules owning them never ran in the forward"),
        ("unknown", "never received a gradient", "the run ended before the forward that would tell why"),
    ):
        entries = gradless.get(key) or []
        if not entries:
            continue
        names = [p for e in entries for p in e["parameters"]]
        modules = ", ".join(e["module"] for e in entries[:3])
        out.symptoms.append(
            run.symptom(
                "frozen-parameters",
                probe=PROBE,
                summary=f"{plural(len(names), 'trainable parameter')} ({', '.join(names[:4])}"
                f"{', …' if len(names) > 4 else ''}) never received a gradient in {plural(checks, 'checked step')}: "
                f"{why} ({modules})",
                values={"parameters": names, "count": len(names), "cause": cause,
                        "modules": [e["module"] for e in entries]},
                rank=rank,
            )
        )


def _constant_loss(run: RunEvidence, rank: int, summary: dict[str, Any], lim: dict[str, Any], out: Analysis) -> None:
    samples = int(summary.get("loss_samples") or 0)
    if not summary.get("loss_equal") or samples < int(lim.get("min_loss_samples", 10)):
        return
    value = summary.get("loss_last")
    steps = summary.get("loss_last_step") or run.steps_completed(rank)
    out.symptoms.append(
        run.symptom(
            "loss-not-decreasing",
            probe=PROBE,
            summary=f"the loss was exactly {value} in all {samples} samples over {plural(steps, 'optimizer step')}: "
            "no update reaches the weights that produce it",
            values={"loss_first": summary.get("loss_first"), "loss_last": value, "steps": steps, "constant": True,
                    "samples": samples},
            location=location(run, summary.get("loss_site")),
            rank=rank,
        )
    )


def _measurements(params: dict[str, Any] | None, summary: dict[str, Any]) -> dict[str, Any]:
    m: dict[str, Any] = {"loss_first": summary.get("loss_first"), "loss_last": summary.get("loss_last"),
                         "loss_samples": summary.get("loss_samples")}
    parts = []
    if params is not None:
        m.update(parameters=params.get("parameters"), without_gradient=params.get("never"))
        parts.append(f"{params.get('parameters')} optimizer parameters, {params.get('never')} without a gradient in "
                     f"{plural(params.get('checks', 0), 'checked step')}")
    if summary.get("loss_samples"):
        parts.append(f"loss {_short(summary.get('loss_first'))} → {_short(summary.get('loss_last'))} "
                     f"({summary.get('loss_samples')} samples)")
    m["summary"] = "; ".join(parts)
    return {k: v for k, v in m.items() if v is not None}


def _short(value: object) -> str:
    """A loss as a person reads it (4 significant digits); non-numbers (None, "nan" strings) as they are."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)

"""Gradient accumulation as it ran: micro-steps per optimizer step, the loss's divisor, dropped micro-steps.

Reads the accumulation probe's events (probes/accumulation.py):
`accumulation-summary` (or the last `accumulation-progress`) and
`accumulation-dropped`. Backward passes per optimizer step are counted twice:
between zero_grad() calls (what the step applies: `histogram`) and between
optimizer steps whatever zero_grad() did (`windows`); a step whose window
was zeroed before every micro-step but the first is `zero-grad-every-micro-step`. Thresholds: rules/data/thresholds.toml [accumulation].
"""

from __future__ import annotations

import statistics
from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.sites import latest, location, plural
from torchdoctor.analysis.source import accumulation_divisor_line

PROBE = "accumulation"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        state = latest(run, PROBE, "accumulation-summary", "accumulation-progress", rank=rank)
        if state is None:
            continue
        hist = {int(k): int(v) for k, v in (state.get("histogram") or {}).items()}
        k = usual_window(hist, float(lim.get("min_share", 0.25)))
        if rank == 0:
            out.measurements = _measurements(hist, k, state)
        _zeroed_between_micro_steps(run, rank, state, lim, out)
        _zeroed_inside_window(run, rank, state, lim, out)
        _never_zeroed(run, rank, state, lim, out)
        _closure_never_zeroed(run, rank, state, lim, out)
        _left_across_steps(run, rank, state, lim, out)
        if k < 2:
            _stepped_every_micro_step(run, rank, state, lim, out)
            continue
        if int(state.get("alternations") or 0) > int(lim.get("max_alternations", 1)):
            if rank == 0:
                out.notes.append(
                    f"Several optimizers step in turn in this run: {k} backward passes per step are not judged as "
                    "gradient accumulation (alternating losses, as in a GAN, look the same)."
                )
            continue
        forwards = int((state.get("forwards") or {}).get(str(k), 0))
        if forwards and forwards < hist.get(k, 0) * float(lim.get("min_forwards_per_micro_step", 0.75)) * k:
            if rank == 0:
                out.notes.append(
                    f"{k} backward passes per optimizer step follow {forwards / max(hist.get(k, 1), 1):.1f} forward "
                    "passes: several losses of the same forward backpropagated one by one, not gradient "
                    "accumulation over micro-batches; not judged."
                )
            continue
        same = int((state.get("same_input_windows") or {}).get(str(k), 0))
        if same and same >= hist.get(k, 0) * float(lim["same_input_share"]):
            if rank == 0:
                out.notes.append(
                    f"{k} backward passes per optimizer step on the same input batch ({same} steps): several "
                    "losses of one batch (sub-networks, heads), not accumulation over micro-batches; their sum is "
                    "not judged as an undivided accumulation."
                )
        else:
            _not_normalized(run, rank, k, state, lim, out)
            _divided_twice(run, rank, k, state, lim, out)
        _dropped(run, rank, k, hist, state, out)
    return out


def usual_window(hist: dict[int, int], min_share: float) -> int:
    """The accumulation a script means: the most frequent count of micro-steps of 2 or more that makes up at
    least `min_share` of the steps (a second phase without accumulation may be as frequent), else the mode."""
    total = sum(hist.values())
    if not total:
        return 0
    accumulating = {k: n for k, n in hist.items() if k >= 2 and n / total >= min_share}
    pool = accumulating or hist
    return max(pool.items(), key=lambda kv: (kv[1], -kv[0]))[0]


def _not_normalized(run: RunEvidence, rank: int, k: int, state: dict[str, Any], lim: dict[str, Any],
                    out: Analysis) -> None:
    factors = state.get("factors") or []
    if len(factors) < int(lim.get("min_factor_samples", 2)):
        return
    factor = statistics.median(factors)
    scale = k * factor
    if scale < float(lim.get("max_gradient_scale", 1.5)):
        return
    norms = state.get("norms") or []
    growth = statistics.median(n["accumulated_norm"] / n["first_norm"] for n in norms if n["first_norm"]) \
        if any(n["first_norm"] for n in norms) else None
    if growth is not None and growth < float(lim.get("rescaled_below_growth", 0.5)):
        # k undivided gradients summed cannot shrink far below the first one's norm: the script rescaled the
        # gradients between backward and the step (fairseq's `p.grad.div_(sample_size)`), so the loss's factor
        # says nothing about the update
        if rank == 0:
            out.notes.append(
                f"{k} backward passes per optimizer step on a loss that is not divided, but the gradient the step "
                f"applies is {growth:.2g}× the first micro-step's: the gradients are rescaled after backward, not "
                "judged as an undivided accumulation."
            )
        return
    values: dict[str, Any] = {"micro_steps": k, "loss_factor": round(factor, 6), "gradient_scale": round(scale, 3)}
    text = (f"{k} backward passes are accumulated into each optimizer step and the loss reaching backward is "
            + ("the criterion's value itself" if factor == 1 else f"the criterion's value × {factor:.4g}")
            + f": the accumulated gradient is {scale:.3g}× the mean gradient of the effective batch")
    if growth is not None:
        values.update(grad_norm_first_micro_step=round(norms[0]["first_norm"], 6),
                      grad_norm_accumulated=round(norms[0]["accumulated_norm"], 6),
                      grad_norm_growth=round(growth, 3))
        text += (f"; measured, the gradient norm grew {growth:.2f}× from the first micro-step to the optimizer step "
                 f"({norms[0]['first_norm']:.4g} → {norms[0]['accumulated_norm']:.4g})")
    out.symptoms.append(
        run.symptom("accumulation-not-normalized", probe=PROBE, summary=text, values=values,
                    location=location(run, state.get("factor_site")), step=None, rank=rank)
    )


def _divided_twice(run: RunEvidence, rank: int, k: int, state: dict[str, Any], lim: dict[str, Any],
                   out: Analysis) -> None:
    """The loss × 1/k² on its way to backward: a framework divides by the micro-steps and so does the script."""
    factors = state.get("factors") or []
    if len(factors) < int(lim.get("min_factor_samples", 2)):
        return
    factor = statistics.median(factors)
    if abs(factor * k * k - 1.0) > float(lim.get("divided_twice_tolerance", 0.2)):
        return
    values: dict[str, Any] = {"micro_steps": k, "loss_factor": round(factor, 6), "gradient_scale": round(k * factor, 4)}
    text = (f"{k} backward passes are accumulated into each optimizer step and the loss reaching backward is the "
            f"criterion's value × {factor:.4g} = 1/{k}²: it is divided by the number of micro-steps twice, so the "
            f"accumulated gradient is 1/{k} of the effective batch's mean gradient")
    out.symptoms.append(
        run.symptom("accumulation-divided-twice", probe=PROBE, summary=text, values=values,
                    location=location(run, state.get("factor_site")), step=None, rank=rank)
    )


def _dropped(run: RunEvidence, rank: int, k: int, hist: dict[int, int], state: dict[str, Any], out: Analysis) -> None:
    """Micro-steps thrown away by zero_grad, left pending at the end, or merged into the next step."""
    events = [e for e in run.of_kind("accumulation-dropped", PROBE, rank) if e.get("at_step", 0) >= 1]
    merged = [(step, n) for step, n in (state.get("sequence") or []) if k < n < 2 * k]
    if not events and not merged:
        return
    parts = []
    values: dict[str, Any] = {"micro_steps": k}
    where = None
    thrown = [e for e in events if e.get("how") == "zero_grad"]
    if thrown:
        counts = [e["micro_steps"] for e in thrown]
        values["dropped_micro_steps"] = statistics.median(counts)
        values["zero_grad_drops"] = len(thrown)
        parts.append(f"zero_grad() threw away {plural(values['dropped_micro_steps'], 'pending micro-step')} "
                     f"{plural(len(thrown), 'time')}")
        where = location(run, thrown[0].get("site"))
    if merged:
        extra = statistics.median(n - k for _, n in merged)
        values.setdefault("dropped_micro_steps", extra)
        values["merged_steps"] = [s for s, _ in merged][:10]
        parts.append(f"{plural(len(merged), 'optimizer step')} (at step {', '.join(str(s) for s, _ in merged[:5])}) "
                     f"summed {k + extra:.0f} micro-steps instead of {k}: a leftover window of {extra:.0f} from the "
                     "epoch before was merged into it")
    end = [e for e in events if e.get("how") == "end"]
    if end:
        values.setdefault("dropped_micro_steps", end[-1]["micro_steps"])
        values["dropped_at_end"] = end[-1]["micro_steps"]
        parts.append(f"{plural(end[-1]['micro_steps'], 'micro-step')} still pending when the script ended never "
                     "reached optimizer.step()")
    out.symptoms.append(
        run.symptom(
            "partial-accumulation-dropped",
            probe=PROBE,
            summary=f"Accumulating {k} micro-steps per optimizer step, a trailing partial window is not stepped: "
            + "; ".join(parts),
            values=values,
            location=where or location(run, state.get("factor_site")),
            rank=rank,
        )
    )


def _zeroed_between_micro_steps(run: RunEvidence, rank: int, state: dict[str, Any], lim: dict[str, Any],
                                out: Analysis) -> None:
    """zero_grad() before every micro-step of an optimizer step: the step applies only the last micro-batch."""
    windows = {int(k): int(v) for k, v in (state.get("windows") or {}).items()}
    zeroed = {int(k): int(v) for k, v in (state.get("zeroed_windows") or {}).items()}
    steps, count = sum(windows.values()), sum(zeroed.values())
    if not count or count < int(lim.get("min_zeroed_steps", 2)) or count / steps < float(lim.get("min_share", 0.25)):
        return
    n = max(zeroed.items(), key=lambda kv: (kv[1], kv[0]))[0]
    text = (f"{plural(count, 'optimizer step')} of {steps} followed {n} backward passes each, and zero_grad() ran "
            f"before every one of them but the first: each step applies the gradient of its last micro-batch "
            f"only, {n - 1} of {n} micro-batches are computed and thrown away")
    values = {"backwards_per_step": n, "zeroed_steps": count, "steps": steps, "micro_steps": n,
              "dropped_micro_steps": n - 1}
    out.symptoms.append(
        run.symptom("zero-grad-every-micro-step", probe=PROBE, summary=text, values=values,
                    location=location(run, state.get("zero_site")), rank=rank)
    )


def _zeroed_inside_window(run: RunEvidence, rank: int, state: dict[str, Any], lim: dict[str, Any],
                          out: Analysis) -> None:
    """zero_grad() inside most accumulation windows, after some micro-steps and before the step.

    The zero_grad-bounded count (`histogram`) then reads fewer micro-steps than the script accumulates, so the
    other checks do not judge it; the probe's `partly_zeroed_windows` count the optimizer-bounded windows that a
    zero_grad of the stepping optimizer's parameters cut (not inside a step, not between backwards of one
    retained graph, not after the parameters moved). Seen with Accelerate, whose wrapped zero_grad() is a no-op
    except on the micro-step that syncs: one at the top of `accumulate()` runs there, after the earlier
    micro-batches' backwards (modelscope/DiffSynth-Studio#1404).
    """
    if any(s.id == "zero-grad-every-micro-step" and s.rank == run.rank_of(rank) for s in out.symptoms):
        return
    windows = {int(k): int(v) for k, v in (state.get("windows") or {}).items()}
    partly = {int(k): int(v) for k, v in (state.get("partly_zeroed_windows") or {}).items()}
    steps, count = sum(windows.values()), sum(partly.values())
    if count < int(lim.get("min_zeroed_steps", 2)) or count / max(steps, 1) < float(lim["min_inside_window_share"]):
        return
    n = max(partly.items(), key=lambda kv: (kv[1], kv[0]))[0]
    thrown = [int(e["micro_steps"]) for e in run.of_kind("accumulation-dropped", PROBE, rank)
              if e.get("how") == "zero_grad" and 1 <= int(e.get("micro_steps", 0)) < n]
    dropped = statistics.median(thrown) if thrown else None
    lost = f"{plural(dropped, 'pending micro-step')} each time" if dropped else "the pending micro-steps"
    text = (f"{plural(count, 'optimizer step')} of {steps} followed {n} backward passes, and zero_grad() ran "
            f"between them, clearing {lost}: each step applies only the micro-batches after the zero_grad(); "
            "the others are computed and thrown away")
    values = {"backwards_per_step": n, "zeroed_steps": count, "steps": steps, "micro_steps": n,
              "dropped_micro_steps": dropped}
    out.symptoms.append(
        run.symptom("zero-grad-every-micro-step", probe=PROBE, summary=text, values=values,
                    location=location(run, state.get("zero_site")), rank=rank)
    )


def _never_zeroed(run: RunEvidence, rank: int, state: dict[str, Any], lim: dict[str, Any], out: Analysis) -> None:
    """Steps whose backward added into the gradients the previous step had applied: nothing cleared them."""
    stale, checked = int(state.get("stale_steps") or 0), int(state.get("stale_checked") or 0)
    if stale < int(lim.get("min_stale_steps", 2)) or stale / max(checked, 1) < float(lim.get("min_stale_share", 0.5)):
        return
    text = (f"{plural(stale, 'optimizer step')} of the {checked} checked began with a backward that added into the "
            "very gradients the step before had applied (no zero_grad(), no grad = None in between): every update "
            "sums the gradients of all earlier batches, so the effective step grows and training drifts")
    values = {"stale_steps": stale, "steps_checked": checked}
    out.symptoms.append(
        run.symptom("missing-zero-grad", probe=PROBE, summary=text, values=values,
                    location=location(run, state.get("stale_site")), rank=rank)
    )


def _stale_enough(run: RunEvidence, rank: int, stale: int, checked: int, lim: dict[str, Any],
                  out: Analysis) -> bool:
    """Whether stale-gradient steps are many enough, absolutely and as a share of those checked, to report
    `missing-zero-grad`, and the rank has no such symptom yet (one cause, one finding)."""
    if any(s.id == "missing-zero-grad" and s.rank == run.rank_of(rank) for s in out.symptoms):
        return False
    share = stale / max(checked, 1)
    return stale >= int(lim.get("min_stale_steps", 2)) and share >= float(lim.get("min_stale_share", 0.5))


def _closure_never_zeroed(run: RunEvidence, rank: int, state: dict[str, Any], lim: dict[str, Any],
                          out: Analysis) -> None:
    """Steps whose closure ran again after the optimizer moved the weights, adding into the gradients of the
    evaluation before it (an LBFGS closure without zero_grad(): skorch-dev/skorch#636)."""
    stale, steps = int(state.get("closure_stale_steps") or 0), int(state.get("closure_steps") or 0)
    if not _stale_enough(run, rank, stale, steps, lim, out):
        return
    text = (f"{plural(stale, 'optimizer step')} of the {steps} that evaluated their closure more than once ran a "
            "backward into the gradients of the evaluation before, taken at other weights (no zero_grad() inside "
            "the closure): the optimizer's line search and curvature estimate work on a sum of stale gradients; "
            "the closure should clear the gradients before its backward")
    values = {"stale_steps": stale, "steps_checked": steps, "closure": True}
    out.symptoms.append(
        run.symptom("missing-zero-grad", probe=PROBE, summary=text, values=values,
                    location=location(run, state.get("closure_site")), rank=rank)
    )


def _left_across_steps(run: RunEvidence, rank: int, state: dict[str, Any], lim: dict[str, Any],
                       out: Analysis) -> None:
    """Steps of an optimizer whose gradients a backward added into while they still held what an earlier backward
    left before another step: a generator loss that reached the discriminator (Lightning-AI/pytorch-lightning#557),
    an actor loss that reached the critic, or a second optimizer that never clears its own."""
    stale, checked = int(state.get("cross_stale_steps") or 0), int(state.get("cross_checked") or 0)
    if not _stale_enough(run, rank, stale, checked, lim, out):
        return
    text = (f"{plural(stale, 'optimizer step')} of the {checked} checked applied gradients that a backward added "
            "into while they still held what an earlier backward had left before another optimizer step (no "
            "zero_grad() of that optimizer in between): with several optimizers, a loss meant for one (a "
            "generator's, through the discriminator) also fills the other's gradients, and the other's step applies "
            "them; clear that optimizer's gradients right before its own backward")
    values = {"stale_steps": stale, "steps_checked": checked, "across_steps": True}
    out.symptoms.append(
        run.symptom("missing-zero-grad", probe=PROBE, summary=text, values=values,
                    location=location(run, state.get("cross_site")), rank=rank)
    )


def _measurements(hist: dict[int, int], k: int, state: dict[str, Any]) -> dict[str, Any]:
    if not hist:
        return {}
    m: dict[str, Any] = {"micro_steps_per_step": k, "histogram": {str(a): b for a, b in sorted(hist.items())},
                         "backwards": state.get("backwards")}
    factors = state.get("factors") or []
    if factors:
        m["loss_factor"] = statistics.median(factors)
    shown = ", ".join(f"{n} micro-step{'s' if n != 1 else ''} ×{c}" for n, c in sorted(hist.items())[:5])
    m["summary"] = f"backward passes per optimizer step: {shown}" + (
        f"; loss × {m['loss_factor']:.4g} on its way to backward" if factors and m["loss_factor"] != 1 else "")
    return m


def _stepped_every_micro_step(run: RunEvidence, rank: int, state: dict[str, Any], lim: dict[str, Any],
                              out: Analysis) -> None:
    """The loss divided by k for gradient accumulation, and an optimizer step after every backward.

    Measured: the constant on the loss's way to backward is 1/k (k >= 2) and (nearly) every optimizer step followed
    one backward. That alone is also a mean of k loss terms (`(l1 + l2 + l3) / 3`) or `0.5 * mse`, so the intent
    comes from the code: the function that calls backward divides by a count named for accumulation
    (`loss / accum_steps`). Then nothing accumulates and every update is 1/k of what the learning rate was tuned
    for (`check`'s TD415 reads the same mistake from the code alone).
    """
    if any(s.rank == run.rank_of(rank) and s.id in ("missing-zero-grad", "zero-grad-every-micro-step")
           for s in out.symptoms):
        return  # one cause, one finding: a zero_grad problem already explains these steps
    factors = state.get("factors") or []
    windows = {int(n): int(c) for n, c in (state.get("windows") or {}).items()}
    steps = sum(windows.values())
    if len(factors) < int(lim.get("min_factor_samples", 2)) or steps < int(lim.get("min_not_applied_steps", 4)):
        return
    if windows.get(1, 0) / steps < float(lim.get("not_applied_share", 0.9)):
        return
    if int(state.get("alternations") or 0) > int(lim.get("max_alternations", 1)):
        return
    factor = statistics.median(factors)
    if not 0 < factor < 1:
        return
    k = round(1 / factor)
    if k < 2 or abs(k * factor - 1) > float(lim.get("not_applied_tolerance", 0.02)):
        return
    site = state.get("factor_site") or {}
    divisor = accumulation_divisor_line(site.get("path", ""), site.get("line")) if site.get("path") else None
    if divisor is None:
        return
    line, name = divisor
    optimizer = state.get("optimizer_class")
    values = {"micro_steps": k, "loss_factor": round(factor, 6), "steps": steps, "single_backward_steps": windows[1]}
    text = (f"The loss reaching backward is divided by `{name}` ({k}: × {factor:.4g}), as for accumulating {k} "
            f"micro-steps per optimizer step, but {windows[1]} of the {plural(steps, 'optimizer step')} followed a "
            f"single backward: nothing accumulates, each update sees one micro-batch (1/{k} of the batch meant)")
    if optimizer in set(lim.get("scale_invariant_optimizers", ())):
        values["optimizer"] = optimizer
        text += f"; {optimizer} normalises the gradient's scale, so the division itself changes its steps little"
    else:
        text += f", and every update is 1/{k} of the size the learning rate was set for"
    out.symptoms.append(
        run.symptom("accumulation-not-applied", probe=PROBE, summary=text, values=values,
                    location=run.location(site["path"], line, site.get("function")), rank=rank)
    )

"""Mixed precision as it ran: autocast regions, loss scaling around backward and clipping, the scale's history.

Reads the amp probe's events (probes/amp.py): `autocast`, `fp16-backward`,
`fp16-zeros`, `clip-scaled`, `scaler-bf16`, `scaler-progress` and the final
`amp-summary`. Thresholds: rules/data/thresholds.toml [amp].
"""

from __future__ import annotations

from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.sites import latest, location, plural

PROBE = "amp"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        summary = latest(run, PROBE, "amp-summary", rank=rank)
        regions = run.of_kind("autocast", PROBE, rank)
        if any(r.get("enabled") for r in regions):
            out.contexts = ["amp"]
        _fp16_without_scaler(run, rank, summary, out)
        _clip_before_unscale(run, rank, summary, out)
        _scaler_with_bf16(run, rank, summary, out)
        if "nan" not in run.probes:  # the nan probe raises loss-scale-collapse itself when it runs
            _collapse(run, rank, lim, out)
        if rank == 0:
            out.measurements = _measurements(run, summary, regions)
    return out


def _fp16_without_scaler(run: RunEvidence, rank: int, summary: dict[str, Any] | None, out: Analysis) -> None:
    events = run.of_kind("fp16-backward", PROBE, rank)
    if not events:
        return
    count = int((summary or {}).get("fp16_unscaled_backwards") or events[-1].get("count", 1))
    device = next((r["device"] for r in run.of_kind("autocast", PROBE, rank) if r.get("dtype") == "float16"), None)
    values: dict[str, Any] = {"backwards": count, "dtype": "float16", "device": device}
    zeros = latest(run, PROBE, "fp16-zeros", rank=rank)
    text = ""
    if zeros is not None and zeros["zero_grad_fraction"] > 0:
        values["zero_grad_fraction"] = zeros["zero_grad_fraction"]
        text = f"; {zeros['zero_grad_fraction']:.1%} of the gradient entries were exactly zero after the first one"
    out.symptoms.append(
        run.symptom(
            "fp16-without-scaler",
            probe=PROBE,
            summary=f"{plural(count, 'backward pass', 'backward passes')} ran on a loss computed under float16 "
            f"autocast{' on ' + device if device else ''} that no GradScaler had scaled{text}",
            values=values,
            location=location(run, events[0].get("site")),
            step=events[0].get("at_step"),
            rank=rank,
        )
    )


def _clip_before_unscale(run: RunEvidence, rank: int, summary: dict[str, Any] | None, out: Analysis) -> None:
    events = run.of_kind("clip-scaled", PROBE, rank)
    if not events:
        return
    first = events[0]
    count = int((summary or {}).get("clip_scaled") or len(events))
    values: dict[str, Any] = {k: first[k] for k in ("function", "scale", "clipped_norm", "max_norm", "clip_value")
                              if first.get(k) is not None}
    values["clips"] = count
    scale = first.get("scale")
    text = f"{first.get('function', 'clip_grad_norm_')} ran {plural(count, 'time')} on gradients still multiplied by " \
        f"the loss scale{f' ({scale:.0f})' if scale else ''}: scaler.unscale_(optimizer) was not called first"
    norm = first.get("clipped_norm")
    if norm is not None and scale:
        values["true_norm"] = round(norm / scale, 6)
        text += f"; it measured a norm of {norm:.4g}, which is {norm / scale:.4g} unscaled"
        if first.get("max_norm") is not None:
            text += f", against max_norm {first['max_norm']:g}"
    out.symptoms.append(
        run.symptom("clip-before-unscale", probe=PROBE, summary=text, values=values,
                    location=location(run, first.get("site")), step=first.get("at_step"), rank=rank)
    )


def _scaler_with_bf16(run: RunEvidence, rank: int, summary: dict[str, Any] | None, out: Analysis) -> None:
    event = latest(run, PROBE, "scaler-bf16", rank=rank)
    if event is None:
        return
    count = int((summary or {}).get("bf16_scaled") or 1)
    out.symptoms.append(
        run.symptom(
            "scaler-with-bf16",
            probe=PROBE,
            summary=f"GradScaler.scale ran {plural(count, 'time')} while every autocast region was bfloat16 "
            f"({plural(event.get('bf16_regions', 0), 'region')}, no float16 one): the scaler has nothing to rescue",
            values={"scaled_losses": count, "bf16_regions": event.get("bf16_regions"), "fp16_regions": 0},
            location=location(run, event.get("site")),
            step=event.get("at_step"),
            rank=rank,
        )
    )


def _collapse(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    state = latest(run, PROBE, "amp-summary", "scaler-progress", rank=rank)
    if state is None or not state.get("attempts"):
        return
    attempts, skipped = int(state["attempts"]), int(state.get("skipped") or 0)
    scale_min = state.get("scale_min")
    reasons = []
    if scale_min is not None and scale_min < float(lim.get("collapse_scale", 1.0)):
        reasons.append(f"the scale fell to {scale_min:.3g}")
    streak = int(state.get("max_streak") or 0)
    if streak >= int(lim.get("collapse_consecutive_skips", 8)):
        reasons.append(f"{streak} steps in a row were skipped")
    if attempts >= int(lim.get("collapse_min_attempts", 10)) and skipped / attempts > float(
            lim.get("collapse_skipped_fraction", 0.25)):
        reasons.append(f"{skipped} of {attempts} steps were skipped")
    if not reasons:
        return
    out.symptoms.append(
        run.symptom(
            "loss-scale-collapse",
            probe=PROBE,
            summary="GradScaler: " + "; ".join(reasons),
            values={"scale": scale_min, "skipped_steps": skipped, "steps": attempts, "max_consecutive_skips": streak,
                    "first_successful_step": state.get("first_success")},
            step=run.steps_completed(rank),
            rank=rank,
        )
    )


def _measurements(run: RunEvidence, summary: dict[str, Any] | None, regions: list[dict[str, Any]]) -> dict[str, Any]:
    m: dict[str, Any] = {}
    kinds = (summary or {}).get("regions") or [dict(r, count=None) for r in regions]
    if kinds:
        m["autocast_regions"] = [
            f"{r['device']} {r['dtype']}{'' if r.get('enabled', True) else ' (disabled)'}"
            + (f" ×{r['count']}" if r.get("count") else "") for r in kinds
        ]
    if summary and summary.get("scaler"):
        m.update(scaler_steps=summary.get("attempts"), scaler_skipped=summary.get("skipped"),
                 scale=summary.get("scale"), scale_min=summary.get("scale_min"))
        changes = summary.get("scale_changes") or []
        if changes:
            m["scale_history"] = changes[:20]
    parts = []
    if m.get("autocast_regions"):
        parts.append("autocast: " + ", ".join(m["autocast_regions"]))
    if "scaler_steps" in m:
        parts.append(f"GradScaler: {m['scaler_steps']} steps, {m['scaler_skipped']} skipped, scale {m.get('scale')}")
    if parts:
        m["summary"] = "; ".join(parts)
    return {k: v for k, v in m.items() if v is not None}

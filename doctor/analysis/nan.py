"""Classify the nan probe's evidence: non-finite loss / gradients / inputs, exploding and vanishing
gradients, a collapsing loss scale.

Reads the events of probes/nan.py (its docstring says what is measured and
how the first bad module is found); thresholds in rules/data/thresholds.toml,
[nan]. A non-finite value is reported once, at its root: a loss that turns
NaN because the previous update wrote NaN into the parameters is evidence on
the non-finite-gradient symptom, not a second diagnosis.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.source import last_assignment_line, op_line, static_callees
from torchdoctor.model import Evidence, Location, Symptom

PROBE = "nan"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        _nonfinite(run, rank, out, lim)
        _exploding(run, rank, lim, out)
        _after_explosion(out.symptoms, run.rank_of(rank))
        _vanishing(run, rank, lim, out)
        _scale_collapse(run, rank, lim, out)
    summaries = run.of_kind("nan-summary", PROBE)
    if any(s.get("scaler") for s in summaries) or run.of_kind("scaler-skip", PROBE):
        out.contexts.append("amp")
    out.measurements = _measurements(run)
    return out


# -- non-finite values --------------------------------------------------------------------------


def _site(run: RunEvidence, event: dict[str, Any]) -> Location | None:
    """The op's user line; the backward call only when no module is to blame (the loss code itself)."""
    if event.get("path") and event.get("line"):
        return run.location(event["path"], event["line"], event.get("function"))
    if event.get("module"):
        return None
    if event.get("backward_path") and event.get("backward_line"):
        return run.location(event["backward_path"], event["backward_line"], event.get("backward_function"))
    return None


def _where(module: str | None, module_type: str | None) -> str:
    if not module:
        return ""
    return f"`{module}` ({module_type})" if module_type and module_type not in module else f"`{module}`"


def _common(event: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {"step": event.get("at_step")}
    for key in ("lr", "loss_scale", "op", "module_type", "autocast"):
        if event.get(key) is not None:
            values[key] = event[key]
    if event.get("cost_ms") is not None:
        values["localisation_ms"] = event["cost_ms"]
    if event.get("detected_late"):
        values["detected_late"] = True
    return values


def _nonfinite(run: RunEvidence, rank: int, out: Analysis, lim: dict[str, Any]) -> None:
    events = run.of_kind("nonfinite", PROBE, rank)
    grad_symptom: Symptom | None = None
    grad_step: int | None = None
    for event in events:
        what = event.get("what")
        phase = event.get("phase")
        step = event.get("at_step")
        if phase == "input":
            out.symptoms.append(_input_symptom(run, rank, event))
        elif what == "loss" and phase == "parameters" and grad_symptom is not None and grad_step is not None \
                and step is not None and step > grad_step:
            grad_symptom.evidence.append(Evidence(
                kind="probe", source=PROBE,
                summary=f"the loss turned non-finite at step {step}: the update of step {grad_step} wrote the "
                f"non-finite gradients into `{event.get('parameter')}`",
                values={"step": step, "parameter": event.get("parameter")},
            ))
        elif what == "loss":
            out.symptoms.append(_loss_symptom(run, rank, event))
            if event.get("outside_model") and not event.get("line"):
                _placed_later(run, rank, out.symptoms[-1], event, lim)
            elif not event.get("line") and not event.get("module") and phase != "parameters":
                # no model call was recorded to replay: the same fallbacks as a loss made outside the model
                _placed_later(run, rank, out.symptoms[-1], event, lim)
        elif what in ("grad", "parameters"):
            grad_symptom = _grad_symptom(run, rank, event)
            grad_step = step
            if event.get("graph_backward") and grad_symptom.location is None:
                _placed_by_graph(run, grad_symptom, event, lim)
            out.symptoms.append(grad_symptom)
        if event.get("unlocalised"):
            out.notes.append(f"nan probe: the non-finite {what} at step {step} was not localised: "
                             f"{event['unlocalised']}.")


def _input_symptom(run: RunEvidence, rank: int, event: dict[str, Any]) -> Symptom:
    step = event.get("at_step")
    field = event.get("batch_field") or event.get("field")
    count = event.get("batch_nonfinite_count", event.get("nonfinite_count"))
    values = _common(event)
    values.update(field=field, nonfinite_count=count, model=event.get("module"), model_input=event.get("field"))
    if event.get("batch_index") is not None:
        values["batch_index"] = event["batch_index"]
    summary = f"the batch of step {step} already holds {count} non-finite value(s) in `{field}`"
    if event.get("batch_index") is not None:
        summary += f" (batch {event['batch_index']} of the epoch)"
    summary += f", before `{event.get('module')}` sees it: the model is not the cause"
    location = None
    if event.get("loader_path") and event.get("loader_line"):
        location = run.location(event["loader_path"], event["loader_line"])
        values["loader_index"] = event.get("loader")
    if event.get("made_path") and event.get("made_line"):
        # the dataset's own code made it: that line, not the DataLoader's, is the one to change
        location = run.location(event["made_path"], event["made_line"])
        values.update(made_op=event.get("made_op"), dataset_item=event.get("made_item"), dataset=event.get("dataset"))
        summary += (f"; fetching that batch's items again, `{event.get('made_op')}` in "
                    f"`{event.get('made_function') or '?'}` (line {event['made_line']}) turned finite values "
                    f"non-finite while {event.get('dataset') or 'the dataset'} built item {event.get('made_item')}")
    return run.symptom("nonfinite-input", probe=PROBE, summary=summary, values=_clean(values), location=location,
                       step=step, rank=rank)


def _loss_symptom(run: RunEvidence, rank: int, event: dict[str, Any]) -> Symptom:
    step = event.get("at_step")
    module, phase = event.get("module"), event.get("phase")
    values = _common(event)
    values.update(first_bad_module=module, phase=phase, loss_value=event.get("loss_value"))
    if event.get("under_scaler"):
        values["under_scaler"] = True
    where = _where(module, event.get("module_type"))
    value = event.get("loss_value", "non-finite")
    if event.get("detected_late"):
        summary = f"the loss was {value} at step {step} (read one step late on CUDA; the first bad module is " \
                  "localised at the next occurrence)"
    elif phase == "parameters":
        values["parameter"] = event.get("parameter")
        summary = (f"the loss was {value} at step {step} because `{event.get('parameter')}` already held "
                   f"non-finite values: an earlier optimizer update wrote them")
    elif not module and event.get("op") and event.get("line"):
        # the model's outputs were finite; the replay of the script's own loss function named the op
        summary = (f"the loss was {value} at step {step} while every output of the model was finite: "
                   f"`{event['op']}` on line {event['line']}"
                   + (f" (in {event['function']})" if event.get("function") else "")
                   + " turned finite values into non-finite ones, replayed on that step's own tensors")
    elif event.get("outside_model"):
        summary = (f"the loss was {value} at step {step} while every output of the model was finite: the loss "
                   "computation itself produced it")
    elif module:
        summary = f"the loss was {value} at step {step}; the first module whose output was non-finite while its " \
                  f"inputs were finite is {where}"
        if event.get("op"):
            summary += f", at `{event['op']}`"
        if event.get("built_here"):
            summary += f" (a layer a library container calls; built on line {event.get('line')})"
        if "float16" in str(event.get("autocast") or ""):
            summary += (f", replayed under the script's float16 autocast ({event['autocast']}): a value past float16's "
                        "range (65504) overflows to inf there")
    else:
        summary = f"the loss was {value} at step {step}"
    return run.symptom("nan-loss", probe=PROBE, summary=summary, values=_clean(values), location=_site(run, event),
                       step=step, rank=rank)


def _placed_later(run: RunEvidence, rank: int, symptom: Symptom, event: dict[str, Any], lim: dict[str, Any]) -> None:
    """A loss that went non-finite outside the model with no line: the op the next steps' watch caught making a
    non-finite value from finite ones (probes/nanwatch.py) names the line instead of `backward()`; failing that,
    the op the bad loss's own graph shows making it (probes/nangraph.py), at the one line of the loss code that
    writes it; failing that, the line that last assigned a non-finite tensor the loss code made without gradient.
    The same for a loss no model call was recorded for (the model's layers run from one of its own methods)."""
    if _placed_by_watch(run, rank, symptom):
        return
    if not _placed_by_graph(run, symptom, event, lim):
        _placed_by_locals(run, symptom, event)


def _place(symptom: Symptom, where: Location | None, said: str, **values: Any) -> None:
    """Move the symptom and its first evidence to the line that made the non-finite value, and say how it was
    placed (each placement below finds the line its own way)."""
    symptom.location = where
    evidence = symptom.evidence[0]
    evidence.location = where
    evidence.summary += said
    evidence.values.update(values)


def _placed_by_watch(run: RunEvidence, rank: int, symptom: Symptom) -> bool:
    found = run.of_kind("nonfinite-op", PROBE, rank)
    if not found or not found[0].get("path") or not found[0].get("line"):
        return False
    op = found[0]
    _place(symptom, run.location(op["path"], op["line"], op.get("function")),
           f"; watching the next steps, `{op.get('op')}` on line {op['line']}"
           + (f" (in {op['function']})" if op.get("function") else "")
           + f" turned finite values into non-finite ones at step {op.get('at_step')}",
           made_op=op.get("op"), made_at_step=op.get("at_step"))
    return True


def _placed_by_locals(run: RunEvidence, symptom: Symptom, event: dict[str, Any]) -> bool:
    """The loss code's own non-finite constants (tensors made with no gradient, probes/nan.py `_constant_locals`):
    the line before the `backward()` that last assigned the first of them."""
    names = [n for n in event.get("constant_locals") or [] if isinstance(n, str)]
    path = event.get("locals_path")
    if not names or not path:
        return False
    found = last_assignment_line(path, event.get("locals_function"), event.get("locals_first"), names,
                                 event.get("locals_line"))
    if found is None:
        return False
    line, name = found
    function = event.get("locals_function")
    _place(symptom, run.location(path, line, None if function == "<module>" else function),
           f"; `{name}`, a tensor computed without gradient and used by the loss, is already non-finite at the "
           f"backward: line {line} last assigned it", nonfinite_constant=name)
    return True


def _placed_by_graph(run: RunEvidence, symptom: Symptom, event: dict[str, Any], lim: dict[str, Any]) -> bool:
    op = event.get("graph_op")
    syntax = (lim.get("loss_op_syntax") or {}).get(op)
    places = [tuple(c) for c in event.get("loss_code") or [] if isinstance(c, list) and len(c) == 3]
    if not op or not syntax or not places:
        return False
    operands = [o for name in event.get("graph_op_inputs") or [] for o in (lim.get("loss_op_syntax") or {}).get(
        name, []) if o.isidentifier()]
    found = op_line(places, list(syntax), operands=operands)
    callees = [tuple(c) for c in event.get("loss_callees") or [] if isinstance(c, list) and len(c) == 3]
    if found is None and callees:
        # not written in the loss code itself: in a helper it called (a loss object's masked mean), among the
        # lines that ran torch ops in the watched step (the branch taken, not its twin)
        ran = {(c[0], c[1]) for c in event.get("loss_lines") or [] if isinstance(c, list) and len(c) == 2}
        found = op_line(places + callees, list(syntax), ran, operands=operands)
        places = places + callees
    if found is None and not callees:
        # nothing ran under watch yet (the first step): the helpers and methods the loss code calls by name, in
        # its own file first, then also those it imports from the project's other files (a losses.py)
        for imports in (False, True):
            statics = static_callees(places, imports=imports)
            if statics:
                found = op_line(places + statics, list(syntax), operands=operands)
                if found is not None:
                    places = places + statics
                    break
    if found is None:
        return False
    path, line = found
    function = next((c[2] for c in places if c[0] == path), None)
    _place(symptom, run.location(path, line, None if function == "<module>" else function),
           (f"; the graph of that backward holds `{op}` in a branch of a `torch.where`: the forward discarded its "
            "inf/NaN, but the backward multiplies the zero gradient of that branch by its infinite derivative "
            f"(0 * inf = NaN); line {line} is the one line of the loss code that writes it (make the op's input safe "
            "before the where, not only its output)" if event.get("graph_masked") else
            f"; the graph of that backward holds one op whose derivative is infinite at a finite point, `{op}`, and "
            f"line {line} is the one line of the loss code that writes it" if event.get("graph_backward") else
            f"; its autograd graph shows `{op}` making the non-finite value from the values it saved, and "
            f"line {line} is the one line of the loss code that writes it"), made_op=op)
    return True


def _grad_symptom(run: RunEvidence, rank: int, event: dict[str, Any]) -> Symptom:
    step = event.get("at_step")
    module = event.get("module")
    parameter = event.get("parameter") or event.get("first_nonfinite_parameter")
    values = _common(event)
    values.update(first_bad_module=module, parameter=parameter, phase=event.get("phase", "backward"))
    if event.get("nonfinite_parameters") is not None:
        values["nonfinite_parameters"] = event["nonfinite_parameters"]
    if event.get("what") == "parameters":
        summary = (f"`{parameter}` became non-finite in an optimizer update before step {step} while the "
                   "gradients that update applied were finite: the update itself (learning rate, eps) or an unchecked step")
    elif module and event.get("phase") == "forward":
        summary = (f"the loss of step {step} was finite but its gradients were not: the forward of "
                   f"{_where(module, event.get('module_type'))}")
        summary += f" (`{event['op']}`)" if event.get("op") else ""
        summary += " made non-finite values that later layers hid from the loss; their gradient is not finite"
        if parameter:
            summary += f", first reaching `{parameter}`"
    elif module:
        summary = (f"the loss of step {step} was finite but its gradients were not: the backward of "
                   f"{_where(module, event.get('module_type'))}")
        summary += f" (`{event['op']}`)" if event.get("op") else ""
        summary += " turned finite gradients into NaN/Inf"
        if parameter:
            summary += f", first reaching `{parameter}`"
    else:
        summary = f"the gradients of step {step} were non-finite" + (f", first `{parameter}`" if parameter else "")
    return run.symptom("nonfinite-grad", probe=PROBE, summary=summary, values=_clean(values),
                       location=_site(run, event), step=step, rank=rank)


def _clean(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


# -- gradient norms ------------------------------------------------------------------------------


def norm_series(run: RunEvidence, rank: int) -> list[tuple[int, float]]:
    """(step, total gradient norm) of every checked step, finite values only."""
    out: list[tuple[int, float]] = []
    for e in run.steps(rank):
        fields = e.get(PROBE)
        if not isinstance(fields, dict):
            continue
        norm = fields.get("grad_norm")
        if isinstance(norm, (int, float)) and math.isfinite(norm):
            out.append((int(fields.get("grad_norm_step", e["step"])), float(norm)))
    return out


def _layers(run: RunEvidence, rank: int) -> list[str]:
    found = run.of_kind("layers", PROBE, rank)
    return list(found[-1].get("layers", [])) if found else []


def _norm_event(run: RunEvidence, rank: int, step: int) -> dict[str, Any] | None:
    events = [e for e in run.of_kind("grad-norms", PROBE, rank) if isinstance(e.get("at_step"), int)]
    if not events:
        return None
    return min(events, key=lambda e: (abs(e["at_step"] - step), -e["at_step"]))


def _exploding(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    series = norm_series(run, rank)
    base_n = int(lim.get("baseline_steps", 3))
    if len(series) <= base_n:
        return
    baseline = statistics.median(n for _, n in series[:base_n])
    if baseline <= 0:
        return
    growth = float(lim.get("exploding_growth", 1000.0))
    crossing = next(((s, n) for s, n in series[base_n:] if n >= growth * baseline), None)
    if crossing is None:
        return
    step, norm = crossing
    peak_step, peak = max(series, key=lambda sn: sn[1])
    values: dict[str, Any] = {
        "grad_norm": peak, "grad_norm_baseline": baseline, "grad_norm_growth": round(peak / baseline, 1),
        "step": step, "peak_step": peak_step, "baseline_steps": base_n,
    }
    layers = _layers(run, rank)
    event = _norm_event(run, rank, peak_step)
    if event is not None:
        norms = event.get("layers") or []
        finite_norms = [(i, v) for i, v in enumerate(norms) if isinstance(v, (int, float)) and math.isfinite(v)]
        if finite_norms and layers:
            i, _ = max(finite_norms, key=lambda iv: iv[1])
            values["layer"] = layers[i] if i < len(layers) else None
            ratio = _ratio(norms)
            if ratio is not None:
                values["grad_norm_ratio"] = ratio
        if event.get("lr") is not None:
            values["lr"] = event["lr"]
    summary = (f"the total gradient norm rose from {baseline:.3g} (median of the first {base_n} steps checked) "
               f"to {norm:.3g} at step {step}")
    if peak_step != step:
        summary += f" and {peak:.3g} at step {peak_step}"
    summary += f": ×{peak / baseline:.3g}"
    out.symptoms.append(run.symptom("exploding-gradients", probe=PROBE, summary=summary, values=_clean(values),
                                    step=step, rank=rank))


def _after_explosion(symptoms: list[Symptom], rank: int | None) -> None:
    """A loss that overflows after the gradients exploded: say so on the nan-loss symptom."""
    exploding = next((s for s in symptoms if s.id == "exploding-gradients" and s.rank == rank), None)
    if exploding is None:
        return
    for s in symptoms:
        if s.id == "nan-loss" and s.rank == rank and s.step is not None and exploding.step is not None \
                and s.step > exploding.step:
            first = s.evidence[0]
            first.summary += f", after the gradient norm exploded from step {exploding.step}"
            first.values["after_exploding_gradients"] = True


def _ratio(norms: list[Any]) -> float | None:
    first, last = (norms[0], norms[-1]) if len(norms) >= 2 else (None, None)
    if not isinstance(first, (int, float)) or not isinstance(last, (int, float)):
        return None
    if not (math.isfinite(first) and math.isfinite(last)) or last <= 0:
        return None
    return float(f"{first / last:.4g}")


def _vanishing(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    layers = _layers(run, rank)
    if len(layers) < 2:
        return
    warm = int(lim.get("warmup_steps", 5))
    points = [(e["at_step"], _ratio(e.get("layers") or []), e) for e in run.of_kind("grad-norms", PROBE, rank)
              if isinstance(e.get("at_step"), int) and e["at_step"] > warm]
    points = [(s, r, e) for s, r, e in points if r is not None]
    if len(points) < int(lim.get("min_points", 3)):
        return
    ratio = statistics.median(r for _, r, _ in points)
    threshold = float(lim.get("vanishing_ratio", 1e-4))
    if ratio > threshold:
        return
    first_norms = [e["layers"][0] for _, _, e in points]
    values = {
        "grad_norm_ratio": float(f"{ratio:.4g}"), "layer": layers[0], "last_layer": layers[-1],
        "grad_norm": float(f"{statistics.median(first_norms):.4g}"), "layers": len(layers),
        "steps_observed": len(points), "from_step": points[0][0], "to_step": points[-1][0],
    }
    summary = (f"the first layer `{layers[0]}` gets {ratio:.2g} of the gradient norm of the last layer "
               f"`{layers[-1]}` (median over steps {points[0][0]}–{points[-1][0]}, {len(layers)} layers)")
    out.symptoms.append(run.symptom("vanishing-gradients", probe=PROBE, summary=summary, values=values,
                                    step=points[-1][0], rank=rank))


# -- GradScaler -----------------------------------------------------------------------------------


def _scale_collapse(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    skips = run.of_kind("scaler-skip", PROBE, rank)
    summaries = run.of_kind("nan-summary", PROBE, rank)
    summary = summaries[-1] if summaries else {}
    if not skips and not summary.get("scaler"):
        return
    steps = run.steps_completed(rank)
    skipped = int(summary.get("skipped_steps", skips[-1]["skipped"] if skips else 0))
    streak = int(summary.get("max_consecutive_skips", max((s.get("streak", 0) for s in skips), default=0)))
    _, scales = run.series(PROBE, "loss_scale", rank)
    scale = summary.get("loss_scale")
    if scale is None:
        scale = scales[-1] if scales else (skips[-1].get("scale") if skips else None)
    attempts = steps + skipped
    fraction = skipped / attempts if attempts else 0.0
    reasons = []
    if isinstance(scale, (int, float)) and scale < float(lim.get("collapse_scale", 1.0)):
        reasons.append(f"the scale fell to {scale:.3g}")
    if streak >= int(lim.get("collapse_consecutive_skips", 8)):
        reasons.append(f"{streak} steps in a row were skipped after the first successful one")
    if attempts >= int(lim.get("collapse_min_attempts", 10)) and fraction > float(lim.get("collapse_skipped_fraction", 0.25)):
        reasons.append(f"{skipped} of {attempts} steps ({fraction:.0%}) were skipped")
    if not reasons:
        return
    values: dict[str, Any] = {"skipped_steps": skipped, "max_consecutive_skips": streak, "steps": steps,
                              "skipped_fraction": round(fraction, 4)}
    if scale is not None:
        values["scale"] = scale
    loss = next((e for e in run.of_kind("nonfinite", PROBE, rank) if e.get("under_scaler")), None)
    if loss is not None and loss.get("module"):
        values["first_bad_module"] = loss["module"]
    out.symptoms.append(run.symptom(
        "loss-scale-collapse", probe=PROBE, summary="GradScaler: " + "; ".join(reasons), values=values,
        step=steps, rank=rank, location=_site(run, loss) if loss else None,
    ))


# -- numbers for the report -------------------------------------------------------------------------


def _measurements(run: RunEvidence) -> dict[str, Any]:
    m: dict[str, Any] = {}
    rank = run.ranks[0]
    _, losses = run.series(PROBE, "loss", rank)
    finite_losses = [v for v in losses if math.isfinite(v)]
    if finite_losses:
        m["loss_first"] = finite_losses[0]
        m["loss_last"] = finite_losses[-1]
    series = norm_series(run, rank)
    if series:
        m["grad_norm_median"] = float(f"{statistics.median(n for _, n in series):.4g}")
        m["grad_norm_last"] = series[-1][1]
    summaries = run.of_kind("nan-summary", PROBE, rank)
    if summaries:
        s = summaries[-1]
        m.update(
            grad_checks=s.get("grad_checks"),
            nonfinite_loss_steps=s.get("nonfinite_loss"),
            nonfinite_grad_steps=s.get("nonfinite_grad"),
            grad_check_us_median=s.get("grad_check_us_median"),
            probe_us_per_step=s.get("probe_us_per_step"),
            probe_us_per_step_median=s.get("probe_us_per_step_median"),
            step_ms=s.get("step_ms"),
        )
        if s.get("scaler"):
            m.update(loss_scale=s.get("loss_scale"), skipped_steps=s.get("skipped_steps"))
    layers = _layers(run, rank)
    if layers:
        m["layers"] = len(layers)
    bad = [e for e in run.of_kind("nonfinite", PROBE, rank) if e.get("cost_ms") is not None]
    if bad:
        m["localisation_ms"] = bad[0]["cost_ms"]
    m["summary"] = _summary_line(m)
    return {k: v for k, v in m.items() if v is not None}


def _summary_line(m: dict[str, Any]) -> str:
    parts = []
    if "grad_checks" in m:
        parts.append(f"{m['grad_checks']} gradient checks")
    if m.get("nonfinite_loss_steps") or m.get("nonfinite_grad_steps"):
        parts.append(f"non-finite loss on {m.get('nonfinite_loss_steps', 0)} steps, "
                     f"gradients on {m.get('nonfinite_grad_steps', 0)}")
    elif "grad_checks" in m:
        parts.append("every checked loss and gradient finite")
    if "grad_norm_median" in m:
        parts.append(f"gradient norm median {m['grad_norm_median']:.3g}")
    if "loss_scale" in m:
        parts.append(f"loss scale {m['loss_scale']}, {m.get('skipped_steps', 0)} steps skipped")
    return "; ".join(parts) or "nothing measured"

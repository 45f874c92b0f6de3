"""Evaluation forwards as they ran: with autograd recording, with dropout/batch norm still training.

Reads the validation probe's events (probes/validation.py): `eval` (the
first forward of each kind at each line), `eval-memory`,
`train-not-restored` and the final `validation-summary` (counts).
Thresholds: rules/data/thresholds.toml [validation].
"""

from __future__ import annotations

from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.sites import latest, location, plural
from torchdoctor.analysis.splits import split_of
from torchdoctor.model import Evidence

PROBE = "validation"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    lim = run.limits(PROBE)
    for rank in run.ranks:
        summary = latest(run, PROBE, "validation-summary", rank=rank)
        groups = (summary or {}).get("groups") or run.of_kind("eval", PROBE, rank)
        if groups:
            out.contexts = ["eval"]
        _with_grad(run, rank, groups, lim, out)
        trained_in_eval = _eval_phase_steps(run, rank, lim, out)
        if not trained_in_eval and not _backward_in_phase(run, rank, lim, out):
            _backward_elsewhere(run, rank, lim, out)
        _stepped_on_eval_loader(run, rank, lim, out)
        _blind_steps(run, rank, lim, out)
        _train_mode(run, rank, groups, out, trained_in_eval)
        if rank == 0:
            out.measurements = _measurements(summary, groups)
    return out


def _with_grad(run: RunEvidence, rank: int, groups: list[dict[str, Any]], lim: dict[str, Any], out: Analysis) -> None:
    found = [g for g in groups if g.get("grad")]
    forwards = sum(int(g.get("count") or 1) for g in found)
    if not found or forwards < int(lim.get("min_eval_forwards", 1)):
        return
    first = found[0]
    values: dict[str, Any] = {"forwards": forwards, "model": first.get("model"), "site_count": len(found)}
    text = (f"{plural(forwards, 'forward pass', 'forward passes')} of {first.get('model')} recorded an autograd graph "
            "that no backward ever used (evaluation without torch.no_grad() or torch.inference_mode())")
    memory = latest(run, PROBE, "eval-memory", rank=rank)
    if memory is not None:
        mib = float(memory["saved_mib"])
        values.update(extra_gib=round(mib / 1024, 6), extra_mib_per_batch=round(mib, 3))
        text += f": each batch's graph keeps ≈ {mib:.2f} MiB of activations alive for nothing"
    out.symptoms.append(
        run.symptom("eval-without-no-grad", probe=PROBE, summary=text, values=values,
                    location=location(run, first.get("site")), step=first.get("first_step"), rank=rank)
    )


def _eval_phase_steps(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> set[str]:
    """Optimizer steps on forwards run in eval mode, between phases of training in train mode: the evaluation
    loop itself calls backward and step. Returns the models concerned."""
    events = run.of_kind("eval-mode-steps", PROBE, rank)
    if not events:
        return set()
    last = events[-1]
    steps = int(last.get("steps") or 0)
    if steps < int(lim.get("min_eval_mode_forwards", 2)):
        return set()
    backward = last.get("backward_site")
    text = (f"{plural(steps, 'forward pass', 'forward passes')} of {last.get('model')} made after model.eval() were "
            f"backpropagated into gradients an optimizer step applied (first at step "
            f"{int(last.get('first_step') or 0) + 1}), and training then went on in train mode "
            f"({plural(int(last.get('phases') or 1), 'evaluation phase')}): the evaluation code runs backward on its "
            "batches, so the model trains on the validation data")
    values = {"eval_mode_forwards": steps, "model": last.get("model"), "phases": last.get("phases"),
              "first_step": last.get("first_step")}
    out.symptoms.append(
        run.symptom("backward-in-validation", probe=PROBE, summary=text, values=values,
                    location=location(run, backward or last.get("site")), step=last.get("first_step"), rank=rank)
    )
    return {str(last.get("model"))}


def _backward_in_phase(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> bool:
    """Backwards run while the script's own phase variable named an evaluation (`phase == "val"`), whose gradients
    an optimizer step applied, by an optimizer that also trained on backwards of its training phase
    (probes/accumulation.py `backward-in-phase`): the phase loop runs backward and step for every phase. Whether
    the symptom was given."""
    found = run.of_kind("backward-in-phase", "accumulation", rank)
    if not found:
        return False
    e = found[-1]
    windows = int(e.get("windows") or 0)
    if windows < int(lim.get("min_phase_windows", 2)) or not e.get("site"):
        return False
    site = e["site"]
    text = (f"on {plural(windows, 'optimizer step')} (first at step {int(e.get('first_step') or 0) + 1}) the "
            f"gradients applied came from backward (line {site.get('line')}, in {site.get('function')}) run while "
            f"{e.get('name')} was {e.get('value')!r}, and the same optimizer trained on "
            f"{plural(int(e.get('train_windows') or 0), 'step')} of the training phase: the evaluation phase "
            "backpropagates and steps too, so the model trains on its validation batches (run backward and "
            "optimizer.step() only when the phase is training, and evaluate under torch.no_grad())")
    values = {"windows": windows, "phase_variable": e.get("name"), "phase": e.get("value"),
              "train_windows": e.get("train_windows"), "function": site.get("function")}
    out.symptoms.append(
        run.symptom("backward-in-validation", probe=PROBE, summary=text, values=values, location=location(run, site),
                    step=e.get("first_step"), rank=rank)
    )
    return True


def _backward_elsewhere(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    """Backwards from a call path the training step never takes, run now and then between two training steps and
    applied by the next optimizer step (no zero_grad() in between; probes/accumulation.py): an evaluation routine
    that backpropagates — through the training step's own helper (a forward_backward), in train mode or not —
    adds its batches' gradients to the next update. Judged when it happened in `min_elsewhere_windows` windows or
    more, in at most `max_elsewhere_share` of the steps, with one optimizer stepping (alternating optimizers, a
    GAN, make windows of several kinds)."""
    found = run.of_kind("backward-elsewhere", "accumulation", rank)
    if not found:
        return
    e = found[-1]
    steps = int(e.get("steps") or 0)
    windows = int(e.get("windows") or 0)
    if windows < int(lim.get("min_elsewhere_windows", 2)) or steps <= 0:
        return
    if int(e.get("extra_windows") or 0) > float(lim.get("max_elsewhere_share", 0.25)) * steps:
        return
    if int(e.get("alternations") or 0) > float(lim.get("max_elsewhere_share", 0.25)) * steps:
        return
    stack, usual = e.get("stack") or [], e.get("usual_stack") or []
    if not stack:
        return
    same = 0
    while same < min(len(stack), len(usual)) and (stack[same]["path"], stack[same]["function"]) == (
            usual[same]["path"], usual[same]["function"]):
        same += 1
    if same < len(stack) and same < len(usual):
        at = stack[same]  # the first function the training path never enters: its call toward the backward
    else:
        at = next((a for a, b in zip(stack, usual, strict=False) if a.get("line") != b.get("line")), stack[-1])
    k = int(e.get("usual_micro_steps") or 1)
    text = (f"on {plural(windows, 'optimizer step')} (first at step {int(e.get('first_step') or 0) + 1}) backward ran "
            f"from {at.get('function')} (line {at.get('line')}), a path the training step never takes, besides the "
            f"usual {plural(k, 'backward')} per step, and no zero_grad() came before the optimizer step: an "
            "evaluation routine backpropagates, so its batches' gradients are added to the next training update")
    values = {"windows": windows, "usual_micro_steps": k, "steps": steps, "function": at.get("function")}
    out.symptoms.append(
        run.symptom("backward-in-validation", probe=PROBE, summary=text, values=values, location=location(run, at),
                    step=e.get("first_step"), rank=rank)
    )


def _stepped_on_eval_loader(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    """Optimizer steps on batches of a loader that holds a validation/test split (its dataset's `train=False` or
    `split`, or the names it is built from), while another loader, not such a split, is trained on too: the
    evaluation pass backpropagates and steps like the training pass (probes/data.py `stepped`). A loader trained
    on alone is not judged (test-time adaptation); nor one whose batches are taken together with another loader's
    (zip: the step counts only the latest batch's loader)."""
    if any(s.id == "backward-in-validation" and s.rank == run.rank_of(rank) for s in out.symptoms):
        return
    built = {int(e["index"]): e for e in run.of_kind("dataloader", "data", rank) if "index" in e}
    least = int(lim.get("min_loader_steps", 2))
    stepped = [(e, built.get(int(e.get("index") or 0), {})) for e in run.of_kind("dataloader-total", "data", rank)
               if int(e.get("stepped") or 0) >= least]
    if len(stepped) < 2:
        return
    splits = [(total, loader, split_of(loader)) for total, loader in stepped]
    trained = [t for t, _, split in splits if split != "eval"]
    evaluated = [(t, loader) for t, loader, split in splits if split == "eval"]
    if not trained or not evaluated:
        return
    total, loader = max(evaluated, key=lambda tl: int(tl[0].get("stepped") or 0))
    steps = int(total.get("stepped") or 0)
    train_steps = sum(int(t.get("stepped") or 0) for t in trained)
    site = _parting_frame(total.get("backward_stack") or [], [t.get("backward_stack") or [] for t in trained])
    said = ("train=False" if loader.get("dataset_train") is False else f"split={loader.get('dataset_split')!r}"
            if loader.get("dataset_split") else "its name")
    text = (f"{plural(steps, 'optimizer step')} applied the gradients of batches from the DataLoader built at line "
            f"{loader.get('line')} ({said}: a validation/test split), next to {train_steps} on the training "
            "loader: the evaluation pass runs backward and optimizer.step() on its batches, so the model trains "
            "on the data it is measured on (evaluate under torch.no_grad(), without backward or step)")
    values = {"eval_loader_steps": steps, "train_loader_steps": train_steps, "loader_line": loader.get("line")}
    out.symptoms.append(
        run.symptom("backward-in-validation", probe="data", summary=text, values=values,
                    location=location(run, site) or location(run, loader), rank=rank)
    )


def _parting_frame(stack: list[dict[str, Any]], others: list[list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The evaluation backward's own line; when a training loader's first backward ran the very same line (one
    shared step helper), the innermost frame of the evaluation's stack that differs from that training stack (the
    evaluation's call of the helper)."""
    if not stack:
        return None
    key = [(f.get("path"), f.get("function"), f.get("line")) for f in stack]
    for other in others:
        theirs = [(f.get("path"), f.get("function"), f.get("line")) for f in other]
        if not theirs or theirs[-1] != key[-1]:
            continue
        i, j = len(key) - 1, len(theirs) - 1
        while i >= 0 and j >= 0 and key[i] == theirs[j]:
            i, j = i - 1, j - 1
        if i >= 0:
            return stack[i]
    return stack[-1]


def _blind_steps(run: RunEvidence, rank: int, lim: dict[str, Any], out: Analysis) -> None:
    """Optimizer steps with no backward since the previous step, right after forwards no backward reached (an
    evaluation loop that kept the training loop's `optimizer.step()`), while gradients were left in the parameters:
    each re-applies the last training batch's gradients. Judged on `min_blind_steps` such steps, fewer than the
    steps that followed a backward (a script whose every step is fed some other way is not judged)."""
    found = run.of_kind("blind-steps", PROBE, rank)
    if not found:
        return
    e = found[-1]
    steps, trained = int(e.get("steps") or 0), int(e.get("steps_with_backward") or 0)
    if steps < int(lim.get("min_blind_steps", 2)) or steps >= trained or not e.get("site"):
        return
    site, forward = e["site"], e.get("forward_site") or {}
    text = (f"{plural(steps, 'optimizer step')} (first at step {int(e.get('first_step') or 0) + 1}) came with no "
            f"backward since the previous step, right after forward passes of {e.get('model')} that no backward "
            f"reached ({'in eval mode, ' if e.get('eval_mode') else ''}line {forward.get('line')}): "
            f"optimizer.step() on line {site.get('line')} runs in the evaluation loop and applies the gradients the "
            "last training batch left again, so the weights move on validation batches (drop the step from the "
            "evaluation, and evaluate under torch.no_grad())")
    values = {"blind_steps": steps, "steps_with_backward": trained, "model": e.get("model"),
              "forward_line": forward.get("line")}
    out.symptoms.append(
        run.symptom("backward-in-validation", probe=PROBE, summary=text, values=values, location=location(run, site),
                    step=e.get("first_step"), rank=rank)
    )


def _train_mode(run: RunEvidence, rank: int, groups: list[dict[str, Any]], out: Analysis,
                trained_in_eval: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    training = [g for g in groups if g.get("training_count")]
    # Training that came back to train mode after an evaluation phase that stepped: that phase is the
    # backward-in-validation above, not a model.train() never restored.
    restored = [r for r in run.of_kind("train-not-restored", PROBE, rank) if str(r.get("model")) not in trained_in_eval]
    if not training and not restored:
        return
    evidence: list[Evidence] = []
    values: dict[str, Any] = {}
    where = None
    step = None
    if training:
        g = training[0]
        forwards = sum(int(t.get("count") or 1) for t in training)
        names = g.get("training_modules") or []
        values.update(modules=names, forwards=forwards, model=g.get("model"))
        summary = (f"{plural(forwards, 'evaluation forward')} of {g.get('model')} ran with "
                   f"{plural(g['training_count'], 'dropout/batch-norm module')} in training mode "
                   f"({', '.join(names[:4])}{', …' if len(names) > 4 else ''}): model.eval() was not called")
        where, step = location(run, g.get("site")), g.get("first_step")
        switched = g.get("train_call_site")
        if switched:
            # model.eval() was called, then model.train() before the evaluation's forwards: that call is the bug
            values["train_call_line"] = switched.get("line")
            after = g.get("eval_call_site") or {}
            summary = (f"{plural(forwards, 'evaluation forward')} of {g.get('model')} ran with "
                       f"{plural(g['training_count'], 'dropout/batch-norm module')} in training mode "
                       f"({', '.join(names[:4])}{', …' if len(names) > 4 else ''}): model.train() on line "
                       f"{switched.get('line')} switched it back to training mode after the model.eval()"
                       + (f" of line {after.get('line')}" if after.get("line") else "")
                       + ", before these forwards")
            where = location(run, switched)
    if restored:
        r = restored[0]
        values.setdefault("modules", r.get("modules") or [])
        values["train_not_restored"] = True
        values["resumed_at_step"] = r.get("at_step")
        modules = plural(r.get("droppers", 0), "dropout/batch-norm module")
        call = r.get("call_site")
        text = (f"training resumed at step {r.get('at_step')} with {modules} of {r.get('model')} still in eval mode: "
                + (f"model.train() was not called after the evaluation that line {call.get('line')} runs (in "
                   f"{call.get('function')})" if call else
                   f"model.train() was not called after the model.eval() of line {r['eval_call_site'].get('line')}"
                   if r.get("eval_call_site") else "model.train() was not called after evaluation"))
        if r.get("never_in_train_mode"):
            # no training forward ever ran in train mode: an evaluation or rollout routine switched the model to
            # eval mode before the first update and nothing switched it back
            off = r.get("eval_call_site") or {}
            values["never_in_train_mode"] = True
            text = (f"{r.get('model')} trained with {modules} in eval mode from its first update on: the "
                    + (f"model.eval() on line {off.get('line')} (in {off.get('function')})" if off.get("line") else
                       "model.eval()")
                    + (f", in the routine that line {call.get('line')} (in {call.get('function')}) runs," if call else
                       "")
                    + " was never followed by model.train(): it belongs after that call, or at the top of the "
                    "training step")
        if r.get("switched_in_step"):
            # switched off inside the training step itself, every step: no evaluation phase to come back from
            off = r.get("eval_call_site") or {}
            values["switched_in_step"] = r["switched_in_step"]
            text = (f"on {plural(r['switched_in_step'], 'training step')} {r.get('model')} was in train mode and then "
                    f"switched to eval mode"
                    + (f" by model.eval() on line {off.get('line')} (in {off.get('function')})" if off.get("line") else "")
                    + (f", which line {call.get('line')} (in {call.get('function')}) runs" if call and
                       call.get("line") != off.get("line") else "")
                    + f", before the forward that step trained: its {modules} train in eval mode; model.train() "
                    "belongs after that call")
        # Where model.train() belongs: after the call that ran the evaluation (validate(), eval_net(...)), not at
        # the evaluation's own forward, which is right to run in eval mode.
        # Inline evaluation: the model.eval() call that put it in eval mode, else the evaluation's forward.
        at = location(run, call or r.get("eval_call_site") or r.get("eval_site") or r.get("site"))
        if call:
            values["evaluation_call"] = True
        if training:
            evidence.append(Evidence(kind="probe", source=PROBE, summary=text, values={"train_not_restored": True},
                                     location=at))
        else:
            summary = text
            where = at
            step = r.get("at_step")
    out.symptoms.append(
        run.symptom("eval-mode-missing", probe=PROBE, summary=summary, values=values, location=where, step=step,
                    rank=rank, evidence=evidence)
    )


def _measurements(summary: dict[str, Any] | None, groups: list[dict[str, Any]]) -> dict[str, Any]:
    if summary is None:
        return {}
    m = {k: summary.get(k) for k in ("forwards", "trained", "eval_grad", "eval_no_grad", "other", "undecided", "us_per_forward",
                                      "models")}
    models = summary.get("models") or 0  # 0 when the run died inside its first forward (a CUDA OOM)
    m["summary"] = (f"{plural(summary.get('forwards', 0), 'top-level forward')}"
                    + (f" of {plural(models, 'model')}" if models else "") + ": "
                    f"{summary.get('trained', 0)} trained, {summary.get('eval_no_grad', 0)} evaluation without grad, "
                    f"{summary.get('eval_grad', 0)} evaluation with grad"
                    # forwards none of the three: no output tensor with a graph although autograd recorded (a frozen
                    # model), or cut off by the end of the run before a backward could reach them
                    + (f", {summary.get('other')} with no output that carries a graph" if summary.get("other") else "")
                    + (f", {summary.get('undecided')} undecided at the end" if summary.get("undecided") else "")
                    + f"; {summary.get('us_per_forward', 0):.1f} µs per forward")
    return {k: v for k, v in m.items() if v is not None}

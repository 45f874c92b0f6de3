"""Custom autograd Functions, checked once after the run with torch.autograd.gradcheck.

Reads the gradcheck probe's events (probes/gradcheck.py): `custom-function`
(each user Function at its first call), `custom-function-unrecorded` (the
first Function past the probe's `max_functions`) and `gradcheck` (the
results, with the time the checks took, reported apart from the training
steps, and how many Functions ran past the limit: each Function that ran is
either checked or named as not checked, never passed over in silence).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.analysis import Analysis
from torchdoctor.analysis.evidence import RunEvidence
from torchdoctor.analysis.sites import latest, location, plural

PROBE = "gradcheck"


def analyse(run: RunEvidence) -> Analysis:
    out = Analysis()
    functions = run.of_kind("custom-function", PROBE, 0)
    first_over = latest(run, PROBE, "custom-function-unrecorded", rank=0)
    if not functions and first_over is None:
        return out
    out.contexts = ["custom-autograd"]
    result = latest(run, PROBE, "gradcheck", rank=0)
    if result is None:
        names = [f["function"] for f in functions[:4]]
        if first_over is not None:
            names.append(f"{first_over['function']} and any later ones")
        out.notes.append(
            f"gradcheck: {plural(len(functions), 'custom autograd Function')}"
            f"{' and more' if first_over is not None else ''} ran ({', '.join(names)}) but were not checked: the "
            "script ended before torchdoctor could run gradcheck (it runs once, when the script finishes or at "
            "--steps)."
        )
        out.measurements = {"functions": len(functions), "summary": "not checked (the run ended first)"}
        return out
    lines = []
    for r in result.get("functions", []):
        status = r.get("status")
        if status == "failed":
            out.symptoms.append(_failed(run, r))
            lines.append(f"{r['function']}: failed (largest error {r.get('max_abs_error')})")
        elif status == "passed":
            lines.append(f"{r['function']}: passed on {r.get('inputs')}")
        elif status == "surrogate-gradient":
            lines.append(f"{r['function']}: a surrogate gradient (piecewise-constant forward)")
            out.notes.append(
                f"gradcheck: `{r['function']}`'s forward is piecewise constant (its numerical gradient is zero at every "
                "point checked, as for round, sign or a quantizer), so its true gradient would train nothing and its "
                "backward is a surrogate on purpose (a straight-through estimator): its gradcheck failure is expected "
                "and not reported as a bug."
            )
        elif status == "gradient-transform":
            lines.append(f"{r['function']}: a deliberate gradient transform (backward = {r.get('scale')} × grad)")
            out.notes.append(
                f"gradcheck: `{r['function']}` returns its input unchanged and its backward returns "
                f"{r.get('scale')} × the incoming gradient: a deliberate gradient transform (gradient reversal or "
                "scaling, as in domain-adversarial training), so its gradcheck failure is expected and not reported "
                "as a bug. If the gradient should pass through unchanged, its backward is wrong."
            )
        else:
            lines.append(f"{r['function']}: not checked")
            out.notes.append(f"gradcheck: `{r['function']}` was not checked, because {r.get('why')}.")
    unrecorded = int(result.get("unrecorded") or 0)
    if unrecorded:
        names = list(result.get("unrecorded_names") or [])
        shown = ", ".join(f"`{n}`" for n in names) + (", …" if unrecorded > len(names) else "")
        out.notes.append(
            f"gradcheck: {plural(unrecorded, 'more custom autograd Function')} ran but "
            f"{'was' if unrecorded == 1 else 'were'} not checked ({shown}), because torchdoctor records only the "
            f"first {result.get('max_functions')} Functions it sees (max_functions in rules/data/thresholds.toml "
            "[gradcheck.instrument]): check them with torch.autograd.gradcheck yourself, or raise the limit."
        )
        lines.append(f"{plural(unrecorded, 'more Function')} not checked (past max_functions)")
    out.measurements = {
        "functions": len(functions),
        "gradcheck_s": result.get("gradcheck_s"),
        "summary": "; ".join(lines) + f" (gradcheck took {result.get('gradcheck_s', 0):.2f} s after the run)",
    }
    if unrecorded:
        out.measurements["not_recorded"] = unrecorded
    return out


def _failed(run: RunEvidence, r: dict[str, Any]) -> Any:
    worst = r.get("max_abs_error")
    arg = r.get("input") or (f"input {r['input_index']}" if r.get("input_index") else None)
    per_input = ", ".join(f"{e.get('input') or 'input ' + str(e['input_index'])}: {e['max_abs_error']:.3g}"
                          for e in r.get("errors", []))
    text = (f"gradcheck failed for {r['function']} on {r.get('inputs')}: its backward disagrees with numerical "
            f"gradients" + (f", worst on `{arg}` (largest absolute error {worst:.3g})" if worst is not None else "")
            + (f"; per input: {per_input}" if per_input else ""))
    call = location(run, r.get("site"))
    values = {"function": r["function"], "max_abs_error": worst, "input": r.get("input"),
              "input_index": r.get("input_index"), "errors": r.get("errors", []), "shapes": r.get("shapes"),
              "inputs": r.get("inputs"), "called_at": str(call) if call else None}
    return run.symptom("bad-custom-backward", probe=PROBE, summary=text, values=values,
                       location=location(run, r.get("backward")))

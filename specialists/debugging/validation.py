"""Evaluation code: forwards that record a graph, a model left in train mode, a backward or an update
during validation.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case
from torchdoctor.specialists.debugging.shared import SPECIALIST
from torchdoctor.specialists.units import count, gib, listing


def _no_grad_fix(case: Case) -> Fix:
    return advice.fix("debugging", "eval-and-inference-mode", location=case.location)


@SPECIALIST.handles("eval-without-no-grad")
def eval_without_no_grad(case: Case) -> Advice:
    extra = case.num("extra_gib")
    cost = f", costing {gib(extra)} of memory for graphs nobody uses" if extra is not None else ""
    where = case.at("Validation")
    return Advice(
        f"{where} runs its forward passes with grad enabled{cost}.",
        [_no_grad_fix(case)],
        [f"`{case.run_cmd('memory', extra='--steps 20')}` measures memory during the validation passes."],
    )


@SPECIALIST.handles("eval-mode-missing")
def eval_mode_missing(case: Case) -> Advice:
    modules = case.names("modules")
    not_restored = case.value("train_not_restored") is True
    where = case.at("Validation")
    if not_restored:
        facts = f"{where} puts the model in eval mode and training resumes without model.train(): dropout stays off and batch norm stops updating."
    else:
        facts = f"{where} runs with dropout and batch norm still in training mode"
        if modules:
            facts += f" ({listing(modules)})"
        facts += ": metrics are noisy, and batch norm's running statistics are updated with validation data."
    return Advice(
        facts,
        [
            _no_grad_fix(case),
            advice.fix("debugging", "restore-train-mode"),
        ],
        [f"`{case.check_cmd(case.rule_code('TD6'))}` finds validation loops without eval() and missing train()."],
    )


@SPECIALIST.handles("backward-in-validation")
def backward_in_validation(case: Case) -> Advice:
    steps = case.num("eval_mode_forwards")
    where = case.at("The evaluation loop")
    facts = f"{where} runs backward and optimizer.step() on batches it evaluates with the model in eval mode"
    if steps is not None:
        facts += f" ({count(steps, 'forward pass', 'forward passes')} in eval mode whose gradients were applied)"
    facts += ": the model trains on the validation set, and the validation loss is no longer a held-out measure."
    return Advice(
        facts,
        [
            advice.fix("debugging", "evaluate-without-updates", location=case.location),
        ],
        [f"`{case.check_cmd(case.rule_code('TD6'))}` reads the validation loops statically."],
    )


@SPECIALIST.handles("training-in-validation")
def training_in_validation(case: Case) -> Advice:
    where = case.at("The validation loop")
    data = case.text("variable") or "the validation data"
    return Advice(
        f"{where} updates the model inside the loop over `{data}`: the model trains on the data that is meant "
        "to judge it, so the validation score, early stopping and best-checkpoint choice all read a number "
        "that no longer measures generalisation.",
        [
            advice.fix("debugging", "validation-without-autograd", location=case.location)
        ],
        [f"`torchdoctor run --probe validation {case.script}` classifies every forward as trained or evaluation "
         "and reports training forwards that run with the model in eval mode."],
    )

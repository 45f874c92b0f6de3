"""Evaluation code: forwards that record a graph, a model left in train mode, a backward or an update
during validation.
"""

from __future__ import annotations

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case
from torchdoctor.specialists.debugging.shared import SPECIALIST
from torchdoctor.specialists.units import count, gib, listing


def _no_grad_fix(case: Case) -> Fix:
    return Fix(
        title="Wrap validation in eval mode and inference mode, then restore train mode",
        snippet=(
            "model.eval()\n"
            "with torch.inference_mode():\n"
            "    for x, y in val_loader:\n"
            "        val_loss += criterion(model(x), y).item()\n"
            "model.train()"
        ),
        why="inference_mode skips graph construction (less memory, faster); eval() switches dropout off and makes "
        "batch norm use its running statistics; train() restores both for the next training step.",
        verify="Validation metrics are identical run to run; validation memory is that of one forward pass.",
        location=case.location,
    )


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
            Fix(
                title="Use a context manager so train mode always comes back",
                snippet=(
                    "from contextlib import contextmanager\n\n"
                    "@contextmanager\n"
                    "def evaluating(model):\n"
                    "    was_training = model.training\n"
                    "    model.eval()\n"
                    "    try:\n"
                    "        yield model\n"
                    "    finally:\n"
                    "        model.train(was_training)"
                ),
                why="An early `return`/`break` in the validation code cannot leave the model in the wrong mode.",
                verify="`model.training` is True at the start of every training step.",
            ),
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
            Fix(
                title="Evaluate without backward, step or zero_grad",
                snippet=(
                    "model.eval()\n"
                    "with torch.no_grad():\n"
                    "    for data, target in val_loader:\n"
                    "        loss = criterion(model(data), target)\n"
                    "        running_loss += loss.item()\n"
                    "model.train()"
                ),
                why="Only the training loop may call loss.backward() and optimizer.step(); under no_grad the "
                "evaluation cannot build a graph to step on by mistake.",
                verify="The optimizer's step count per epoch equals the number of training batches.",
                location=case.location,
            ),
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
            Fix(
                title="Drop the update lines and run validation without autograd",
                snippet="@torch.no_grad()\ndef validate(model, val_loader):\n    model.eval()\n"
                "    for x, y in val_loader:\n        loss = criterion(model(x), y)   # no backward, no step",
                why="Validation only reads the model; no_grad also stops autograd from keeping activations.",
                verify="The model's parameters are bit-identical before and after a validation pass.",
                location=case.location,
            )
        ],
        [f"`torchdoctor run --probe validation {case.script}` classifies every forward as trained or evaluation "
         "and reports training forwards that run with the model in eval mode."],
    )

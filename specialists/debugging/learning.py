"""A model that does not learn or learns the wrong thing: a flat loss, a loss fed the wrong inputs,
gradients that never accumulate or never arrive, dropout left on.
"""

from __future__ import annotations

import math

from torchdoctor.specialists import advice
from torchdoctor.specialists.base import Advice, Case
from torchdoctor.specialists.debugging.shared import SPECIALIST, lr_fix
from torchdoctor.specialists.units import count, listing


def _uniform_classes(loss: float) -> int | None:
    """The n for which loss == ln(n): a classifier predicting a uniform distribution."""
    if not math.isfinite(loss) or not 0.5 < loss < 12:
        return None  # ln(100 000) is 11.5; an inf loss (log of 0) has no n and must not raise
    n = round(math.exp(loss))
    return n if 2 <= n <= 100_000 and abs(math.log(n) - loss) < 2e-3 else None


@SPECIALIST.handles("loss-not-decreasing")
def not_learning(case: Case) -> Advice:
    first = case.num("loss_first")
    last = case.num("loss_last")
    steps = case.num("steps")
    constant = case.value("constant") is True or (first is not None and last is not None and first == last)
    facts = "The model does not learn."
    if first is not None and last is not None:
        span = f" over {count(steps, 'step')}" if steps is not None else ""
        if constant:
            facts = f"The loss stays exactly at {last:.4f}{span}: no gradient reaches the weights, or the update is zero."
        else:
            facts = f"The loss moves from {first:.4f} to {last:.4f}{span}: barely learning."
        classes = _uniform_classes(last)
        if classes:
            facts += f" {last:.4f} is ln({classes}): the model predicts a uniform distribution over {classes} classes."
    return Advice(
        facts,
        [
            advice.fix("debugging", "check-gradients-reach-parameters", location=case.location),
            advice.fix("debugging", "overfit-one-batch"),
            advice.fix("debugging", "loss-input-contract"),
            lr_fix(),
        ],
        [
            f"`{case.check_cmd('TD6')}` looks for eval-mode, loss and graph-cutting mistakes in the source.",
            f"`{case.run_cmd('nan', extra='--steps 50')}` checks that gradients are finite and reach every layer.",
        ],
    )


@SPECIALIST.handles("softmax-before-loss")
def softmax_before_loss(case: Case) -> Advice:
    where = case.at("The model")
    return Advice(
        f"{where} feeds probabilities to a loss that applies log-softmax itself: the loss is computed on "
        "softmax(softmax(x)), its gradients shrink, and training plateaus.",
        [
            advice.fix("debugging", "return-logits", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds softmax outputs passed to CrossEntropyLoss."],
    )


@SPECIALIST.handles("unstable-log-softmax")
def log_softmax(case: Case) -> Advice:
    where = case.at("The code")
    return Advice(
        f"{where} takes the log of a softmax: probabilities underflow to 0 and their log becomes -inf.",
        [
            advice.fix("debugging", "log-softmax", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD6'))}` finds every such call."],
    )


@SPECIALIST.handles("bce-after-sigmoid")
def bce_after_sigmoid(case: Case) -> Advice:
    where = case.at("The loss")
    return Advice(
        f"{where} applies BCELoss to sigmoid outputs: saturated sigmoids give log(0) and vanishing gradients, and "
        "under autocast BCELoss raises an error.",
        [
            advice.fix("debugging", "bce-with-logits", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD6'))}` finds every such pair."],
    )


@SPECIALIST.handles("missing-zero-grad")
def missing_zero_grad(case: Case) -> Advice:
    where = case.at("The training loop")
    return Advice(
        f"{where} never clears gradients, so each step applies the sum of all previous gradients: the effective "
        "learning rate grows every step until the loss diverges.",
        [
            advice.fix("debugging", "zero-grad-per-step", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD4'))}` checks the loop's zero_grad / step order."],
    )


@SPECIALIST.handles("non-differentiable")
def non_differentiable(case: Case) -> Advice:
    params = case.names("parameters")
    where = case.at()
    facts = "The graph is cut before the loss: parameters upstream of the cut receive no gradient"
    if params:
        facts += f" ({listing(params)})"
    if where:
        facts += f"; the cut is at {where}"
    facts += "."
    return Advice(
        facts,
        [
            advice.fix("debugging", "list-parameters-without-grad", location=case.location)
        ],
        [f"`{case.check_cmd('TD8')}` finds .detach()/.numpy() inside forward methods."],
    )


@SPECIALIST.handles("functional-dropout-always-on")
def functional_dropout(case: Case) -> Advice:
    where = case.at("The forward")
    return Advice(
        f"{where} applies F.dropout without training=self.training, so validation and inference still drop "
        "activations: eval metrics are noisy and lower than they should be.",
        [
            advice.fix("debugging", "dropout-follows-mode", location=case.location)
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds functional dropout calls."],
    )

"""A model that does not learn or learns the wrong thing: a flat loss, a loss fed the wrong inputs,
gradients that never accumulate or never arrive, dropout left on.
"""

from __future__ import annotations

import math

from torchdoctor.model import Fix
from torchdoctor.specialists.base import Advice, Case
from torchdoctor.specialists.debugging.shared import SPECIALIST, lr_fix
from torchdoctor.specialists.units import count, listing


def _uniform_classes(loss: float) -> int | None:
    """The n for which loss == ln(n): a classifier predicting a uniform distribution."""
    if loss <= 0.5:
        return None
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
            Fix(
                title="Check that every trainable parameter gets a gradient and moves",
                snippet=(
                    "loss.backward()\n"
                    "for name, p in model.named_parameters():\n"
                    "    if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0):\n"
                    "        print('no gradient:', name)"
                ),
                why="A `.detach()`/`.item()`/`.numpy()` in the forward, an optimizer built over another model's "
                "parameters, or frozen layers leave the weights untouched.",
                verify="Every parameter prints a non-zero gradient, and parameters change after optimizer.step().",
                location=case.location,
            ),
            Fix(
                title="Overfit one batch",
                snippet="x, y = next(iter(loader))\nfor _ in range(200):\n    optimizer.zero_grad()\n"
                "    loss = criterion(model(x), y)\n    loss.backward()\n    optimizer.step()\nprint(loss.item())  # should approach 0",
                why="A model that cannot memorise 32 samples has a bug (loss/label pairing, a broken graph, a wrong "
                "output activation), not a tuning problem.",
                verify="The loss on the single batch goes close to zero within a few hundred steps.",
            ),
            Fix(
                title="Feed the loss what it expects",
                snippet="loss = F.cross_entropy(logits, target)   # raw logits, integer class targets\n"
                "loss = F.binary_cross_entropy_with_logits(logit, target.float())",
                why="Softmax before CrossEntropyLoss, or sigmoid before BCELoss, squashes the gradients; "
                "swapped (target, output) arguments train towards nonsense.",
                verify="`torchdoctor check` reports no TD2/TD6 loss findings.",
            ),
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
            Fix(
                title="Return logits from forward; let the loss do the softmax",
                snippet="logits = model(x)               # no softmax at the end of forward\n"
                "loss = F.cross_entropy(logits, y)\n"
                "probs = logits.softmax(dim=-1)   # only for predictions",
                why="cross_entropy = log_softmax + nll_loss; softmax applied twice compresses all outputs towards uniform.",
                verify="The loss starts near ln(num_classes) and falls; accuracy rises.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds softmax outputs passed to CrossEntropyLoss."],
    )


@SPECIALIST.handles("unstable-log-softmax")
def log_softmax(case: Case) -> Advice:
    where = case.at("The code")
    return Advice(
        f"{where} takes the log of a softmax: probabilities underflow to 0 and their log becomes -inf.",
        [
            Fix(
                title="Use log_softmax, or cross_entropy on the raw logits",
                snippet="logp = F.log_softmax(logits, dim=-1)\n# or, for a classification loss:\nloss = F.cross_entropy(logits, target)",
                why="log_softmax computes x - logsumexp(x) in one stable step; it never forms the tiny probabilities.",
                verify="No -inf/NaN in the log-probabilities for large logits.",
                location=case.location,
            )
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
            Fix(
                title="Feed the logits to BCEWithLogitsLoss",
                snippet="criterion = nn.BCEWithLogitsLoss()\nloss = criterion(logits, target.float())\n"
                "probs = torch.sigmoid(logits)  # only for metrics / predictions",
                why="It fuses sigmoid and the log-loss with the log-sum-exp trick: stable, and safe to autocast.",
                verify="No NaN loss for large |logits|; same loss value as before where both were finite.",
                location=case.location,
            )
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
            Fix(
                title="Clear gradients once per optimizer step",
                snippet="optimizer.zero_grad()   # sets .grad to None (the default since PyTorch 2.0)\n"
                "loss = criterion(model(x), y)\nloss.backward()\noptimizer.step()",
                why="backward() adds into .grad; without clearing, gradients accumulate across steps.",
                verify="The gradient norm per step stays bounded instead of growing linearly.",
                location=case.location,
            )
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
            Fix(
                title="List the parameters left without a gradient after backward",
                snippet="loss.backward()\nprint([n for n, p in model.named_parameters() if p.requires_grad and p.grad is None])",
                why="The names show where the cut is: everything before a .detach(), .item(), .numpy() or an integer op.",
                verify="The list is empty after the fix.",
                location=case.location,
            )
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
            Fix(
                title="Tie dropout to the module's mode",
                snippet="x = F.dropout(x, p=0.1, training=self.training)\n# or an nn.Dropout(0.1) submodule",
                why="F.dropout defaults to training=True; the module form follows model.eval().",
                verify="With model.eval(), repeated forwards on the same input give identical outputs.",
                location=case.location,
            )
        ],
        [f"`{case.check_cmd(case.rule_code('TD2'))}` finds functional dropout calls."],
    )

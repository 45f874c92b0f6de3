"""Findings claim only what the code shows: a claim that rests on code the file cannot show reports at info
(the clear shapes stay warnings), and a message does not state a cost the code does not have.

A rule may lower a finding's severity (`ctx.report(..., severity="info")`): info does not gate CI, and the
finding is still there for a reader (and for recall). The levels compared here are the ones the rule reports,
before calibration (`Result.reported`). Each weak shape here comes from real code where the
warning was wrong; its strong neighbour, where the file itself shows the problem, keeps the rule's severity.
"""

from __future__ import annotations

from tests.conftest import FIXTURES
from torchdoctor.rules.static.engine import analyse_text

RULES = FIXTURES / "check" / "rules"


def severities(text: str, code: str, path: str = "model.py") -> dict[int, str]:
    """The level each finding's rule reported it at, before the rule's calibration to its record on real code
    (a rule calibrated to info reports everything at info by default; a project can raise it, and then the weak
    shapes here stay at info while the strong ones become warnings)."""
    result = analyse_text(text, path, codes=[code])
    return {r.finding.line: r.reported or r.finding.severity for r in result.results if r.finding.code == code}


def test_a_dropout_rate_handed_in_by_unseen_callers_is_info():
    text = (RULES / "TD209" / "fire_rate_from_unseen_caller.py").read_text()
    found = severities(text, "TD209")
    assert found and set(found.values()) == {"info"}, found


def test_the_same_rate_with_the_callers_in_the_file_stays_a_warning():
    text = (RULES / "TD209" / "fire_rate_from_unseen_caller.py").read_text() + '''

decoder = Decoder(8, 4, 16, 100)
logits, _ = decoder(torch.randn(2, 5, 8), torch.randn(2, 4), 0.3)
'''
    found = severities(text, "TD209")
    assert found and set(found.values()) == {"warning"}, found


def test_a_fixed_rate_stays_a_warning():
    found = severities((RULES / "TD209" / "fire.py").read_text(), "TD209")
    assert found and set(found.values()) == {"warning"}, found


def test_a_log_of_the_complement_of_a_parameter_is_info():
    # fire.py's `_neg_loss(pred, gt)` and `FocalLoss.forward(x, ...)`: `1 - pred` is 0 only if the caller's
    # prediction can round to 1, which this file cannot see (CenterNet clamps it three calls away).
    text = (RULES / "TD609" / "fire.py").read_text()
    found = severities(text, "TD609", "losses.py")
    lines = text.splitlines()
    weak = {n for n, line in enumerate(lines, 1) if "torch.log(p_t)" in line or "neg_loss = torch.log(1 - pred)" in line}
    assert weak and {found[n] for n in weak} == {"info"}, found
    assert {s for n, s in found.items() if n not in weak} == {"warning"}, found


def test_the_complement_of_a_sigmoid_made_here_stays_a_warning():
    text = '''
import torch

def focal_loss(logits, target, gamma=2.0):
    p = torch.sigmoid(logits)
    neg_loss = torch.log(1 - p) * p ** gamma * (1 - target)
    pos_loss = torch.log(p) * (1 - p) ** gamma * target
    return -(neg_loss + pos_loss).mean()
'''
    assert set(severities(text, "TD609", "losses.py").values()) == {"warning"}


def test_in_one_function_a_log_the_function_shows_wins_over_a_weak_one():
    text = '''
import torch

def mixed_loss(pred, logits):
    a = torch.log(1 - pred)
    b = torch.log(torch.sigmoid(logits))
    loss = a.mean() + b.mean()
    return loss
'''
    assert severities(text, "TD609", "losses.py") == {6: "warning"}


def test_forward_on_an_optional_argument_named_like_a_model_is_info():
    text = (RULES / "TD202" / "fire_optional_model_argument.py").read_text()
    found = severities(text, "TD202", "degradation.py")
    lines = text.splitlines()
    optional = next(n for n, line in enumerate(lines, 1) if "isp_model.forward" in line)
    required = next(n for n, line in enumerate(lines, 1) if "model.forward(x)" in line)
    assert found == {optional: "info", required: "warning"}, found


def test_a_loader_rebuilt_each_epoch_around_a_dataset_built_once_does_not_claim_the_dataset_is_rebuilt():
    # Real-Time-Voice-Cloning's vocoder/train.py: the dataset is built once, the DataLoader every epoch.
    text = '''
import torch
from torch.utils.data import DataLoader
from vocoder.dataset import VocoderDataset

def train(model, optimizer, metadata, mels, wavs):
    dataset = VocoderDataset(metadata, mels, wavs)
    for epoch in range(1, 350):
        data_loader = DataLoader(dataset, 32, shuffle=True, num_workers=2)
        for x, y in data_loader:
            loss = (model(x.cuda()) - y.cuda()).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
'''
    result = analyse_text(text, "train.py", codes=["TD508"])
    messages = [r.finding.message for r in result.results]
    assert len(messages) == 1 and "worker processes are started again" in messages[0], messages
    inside = text.replace("    dataset = VocoderDataset(metadata, mels, wavs)\n", "").replace(
        "        data_loader = DataLoader(dataset,", "        dataset = VocoderDataset(metadata, mels, wavs)\n"
        "        data_loader = DataLoader(dataset,")
    messages = [r.finding.message for r in analyse_text(inside, "train.py", codes=["TD508"]).results]
    assert len(messages) == 1 and "dataset is constructed again" in messages[0], messages


def test_eval_mode_left_on_in_a_file_that_never_steps_an_optimizer_is_info():
    text = (RULES / "TD602" / "fire_backward_without_optimizer.py").read_text()
    assert set(severities(text, "TD602", "bench.py").values()) == {"info"}
    stepped = text.replace("def score_rounds(pruner, imp,", "def score_rounds(pruner, imp, optimizer,").replace(
        "            loss.backward()\n", "            loss.backward()\n            optimizer.step()\n")
    stepped = stepped.replace("    for _ in range(rounds):", "    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
                              "    for _ in range(rounds):")
    assert set(severities(stepped, "TD602", "bench.py").values()) == {"warning"}


def test_a_host_read_of_results_another_file_returns_beside_the_loss_is_info():
    text = (RULES / "TD507" / "fire_loss_stats_from_another_file.py").read_text()
    found = severities(text, "TD507", "train.py")
    lines = text.splitlines()
    first = next(n for n, line in enumerate(lines, 1) if "loss_components[0])))  # expect" in line)
    second = next(n for n, line in enumerate(lines, 1) if "loss.item()" in line)
    assert found == {first: "info", second: "warning"}, found


def test_a_save_under_a_private_local_rank_attribute_is_one_writer_per_node():
    text = (RULES / "TD303" / "fire_private_local_rank_attribute.py").read_text()
    messages = [r.finding.message for r in analyse_text(text, "modeling_utils.py", codes=["TD303"]).results]
    assert len(messages) == 1 and "first process of every node" in messages[0], messages


def test_a_log_of_a_parameter_a_caller_here_fills_with_a_sigmoid_stays_a_warning():
    text = (RULES / "TD609" / "fire_caller_hands_in_a_sigmoid.py").read_text()
    assert set(severities(text, "TD609", "bgan.py").values()) == {"warning"}


ATTACK = '''
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

model = torch.load("mnist_model.pt").cuda()
test_loader = DataLoader(datasets.MNIST("data", train=False, transform=transforms.ToTensor()), batch_size=100)
for X, y in test_loader:
    X, y = X.cuda(), y.cuda()
    delta = torch.zeros_like(X, requires_grad=True)
    for _ in range(40):
        F.cross_entropy(model(X + delta), y).backward()
        delta.data = (delta + 0.01 * delta.grad.sign()).clamp(-0.3, 0.3)
        delta.grad.zero_()
'''


def test_a_loader_feeding_attacks_in_a_file_that_steps_no_optimizer_is_info():
    # fast_adversarial's MNIST/evaluate_mnist.py: PGD attacks take gradients of the input; nothing trains
    found = severities(ATTACK, "TD501", "evaluate_mnist.py")
    assert found and set(found.values()) == {"info"}, found


def test_the_same_loader_feeding_a_training_step_stays_a_warning():
    trained = ATTACK.replace('model = torch.load("mnist_model.pt").cuda()\n', 'model = torch.load("mnist_model.pt").cuda()\n'
                             'optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n').replace(
        "        delta.grad.zero_()\n", "        delta.grad.zero_()\n    optimizer.step()\n")
    found = severities(trained, "TD501", "train_mnist.py")
    assert found and set(found.values()) == {"warning"}, found

"""TD205 across files and objects: what a model's output is when the model is not built beside the loss.

Each shape comes as a pair: the bug (a model class that ends in a softmax, fed to a cross-entropy loss in another
file, through a trainer's constructor, a run-time choice of class, a wrapper, or a layer stack built by code) and
its healthy twin (the same code returning logits), which must stay silent.
"""

from __future__ import annotations

import pytest

from torchdoctor.check import CheckRequest, build_report, prepare

MODELS = """import torch.nn as nn
import torch.nn.functional as F


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(x)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=1)
"""
SOFTMAX_LINE = 20  # MLP's `return F.softmax(...)`

# the healthy twin: MLP returns its logits too
LOGITS_MODELS = MODELS.replace("return F.softmax(self.fc(x), dim=1)", "return self.fc(x)")


def _findings(tmp_path, monkeypatch, files: dict[str, str]) -> list[tuple[str, int, str, str]]:
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    request = CheckRequest(paths=["."], fmt="json", fail_on="never")
    return [(f.path, f.line, f.code, f.fix or "") for f in build_report(request, prepare(request)).findings
            if f.code in ("TD205", "TD210")]


CHOSEN_BY_IF = """import sys
import torch
import torch.nn as nn
from models import CNN, MLP

if sys.argv[1] == "cnn":
    model = CNN()
elif sys.argv[1] == "mlp":
    model = MLP()
else:
    raise SystemExit("unknown model")
criterion = nn.CrossEntropyLoss()
x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
loss = criterion(model(x), y)
loss.backward()
"""

CHOSEN_FROM_TABLE = """import sys
import torch
import torch.nn.functional as F
from models import CNN, MLP

ARCHS = {"cnn": CNN, "mlp": MLP}
model = ARCHS[sys.argv[1]]()
x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
loss = F.cross_entropy(model(x), y)
loss.backward()
"""

TRAIN_FUNCTION = """import torch.nn.functional as F


def train(model, loader, opt):
    for x, y in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
"""

CHOSEN_BY_CONDITION = """import sys
import torch
from models import CNN, MLP
from train import train

model = CNN() if sys.argv[1] == "cnn" else MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train(model, [(torch.randn(4, 8), torch.randint(0, 3, (4,)))], opt)
"""

WRAPPED = """import torch
import torch.nn as nn
from models import MLP

model = nn.DataParallel(MLP()).to("cpu")
criterion = nn.CrossEntropyLoss()
x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
loss = criterion(model(x), y)
loss.backward()
"""

TRAINER = """import torch
import torch.nn as nn


class Trainer:
    def __init__(self, model, lr=0.1):
        self.model = model
        self.criterion = nn.CrossEntropyLoss()
        self.opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step(self, x, y):
        self.opt.zero_grad()
        out = self.model(x)
        loss = self.criterion(out, y)
        loss.backward()
        self.opt.step()
"""

TRAINER_MAIN = """import torch
from models import MLP
from trainer import Trainer

t = Trainer(MLP())
t.step(torch.randn(4, 8), torch.randint(0, 3, (4,)))
"""


CASES = {
    "if-chain": {"main.py": CHOSEN_BY_IF},
    "table of classes": {"main.py": CHOSEN_FROM_TABLE},
    "conditional expression handed to a function": {"main.py": CHOSEN_BY_CONDITION, "train.py": TRAIN_FUNCTION},
    "wrapper around a call": {"main.py": WRAPPED},
    "trainer's constructor": {"main.py": TRAINER_MAIN, "trainer.py": TRAINER},
    "trainer's constructor by keyword": {"main.py": TRAINER_MAIN.replace("Trainer(MLP())", "Trainer(model=MLP())"),
                                         "trainer.py": TRAINER},
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_softmax_class_of_another_file_reaching_cross_entropy_is_found_at_its_softmax(tmp_path, monkeypatch, case):
    found = _findings(tmp_path, monkeypatch, {"models.py": MODELS, **CASES[case]})
    assert [f[:3] for f in found] == [("models.py", SOFTMAX_LINE, "TD205")]


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_code_with_models_that_return_logits_is_silent(tmp_path, monkeypatch, case):
    assert _findings(tmp_path, monkeypatch, {"models.py": LOGITS_MODELS, **CASES[case]}) == []


@pytest.mark.parametrize("case", ["if-chain", "table of classes", "conditional expression handed to a function"])
def test_a_model_chosen_at_run_time_names_the_other_candidates(tmp_path, monkeypatch, case):
    [(_path, _line, _code, fix)] = _findings(tmp_path, monkeypatch, {"models.py": MODELS, **CASES[case]})
    assert "chosen at run time" in fix and "CNN" in fix


def test_a_trainer_that_replaces_the_model_it_is_handed_is_not_joined(tmp_path, monkeypatch):
    # `self.model` assigned twice in __init__: what the loss sees is not simply what the caller handed in
    trainer = TRAINER.replace("        self.model = model\n",
                              "        self.model = model\n        if lr < 0:\n            self.model = None\n")
    assert _findings(tmp_path, monkeypatch, {"models.py": MODELS, "main.py": TRAINER_MAIN,
                                             "trainer.py": trainer}) == []


def test_a_trainer_handed_a_logits_model_while_another_file_builds_the_softmax_one_is_silent(tmp_path, monkeypatch):
    main = TRAINER_MAIN.replace("from models import MLP", "from models import CNN, MLP").replace(
        "Trainer(MLP())", "Trainer(CNN())\nprobs = MLP()(torch.randn(4, 8))")
    assert _findings(tmp_path, monkeypatch, {"models.py": MODELS, "main.py": main, "trainer.py": TRAINER}) == []


STACKS = """import torch.nn as nn


class Net(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        layers = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers.append(nn.Linear(a, b))
            layers.append(nn.ReLU())
        layers[-1] = nn.Softmax(dim=1)
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential()
        self.net.add_module("fc", nn.Linear(8, 3))
        self.net.add_module("softmax", nn.Softmax(dim=1))

    def forward(self, x):
        return self.net(x)
"""

STACKS_MAIN = """import torch
import torch.nn as nn
from models import {cls}

model = {cls}({args})
criterion = nn.CrossEntropyLoss()
x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
loss = criterion(model(x), y)
loss.backward()
"""


@pytest.mark.parametrize(("cls", "args", "line"), [("Net", "[8, 3]", 11), ("Head", "", 23)])
def test_a_layer_stack_built_by_code_that_ends_in_softmax_is_found(tmp_path, monkeypatch, cls, args, line):
    main = STACKS_MAIN.format(cls=cls, args=args)
    assert [f[:3] for f in _findings(tmp_path, monkeypatch, {"models.py": STACKS, "main.py": main})] == [
        ("models.py", line, "TD205")]


@pytest.mark.parametrize(("cls", "args"), [("Net", "[8, 3]"), ("Head", "")])
def test_a_layer_stack_built_by_code_that_ends_in_a_linear_layer_is_silent(tmp_path, monkeypatch, cls, args):
    # the softmax replaced by a last linear layer; the other class keeps its own `self.net`, which must not leak
    stacks = STACKS.replace("        layers[-1] = nn.Softmax(dim=1)\n",
                            "        layers[-1] = nn.Softmax(dim=1)\n        layers.append(nn.Linear(3, 3))\n")
    if cls == "Head":
        stacks = STACKS.replace('self.net.add_module("softmax", nn.Softmax(dim=1))',
                                'self.net.add_module("out", nn.Linear(3, 3))')
    main = STACKS_MAIN.format(cls=cls, args=args)
    assert _findings(tmp_path, monkeypatch, {"models.py": stacks, "main.py": main}) == []


EXP_MODEL = """import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return torch.exp(F.log_softmax(self.fc(x), dim=1))
"""


def test_exp_of_log_softmax_is_probabilities(tmp_path, monkeypatch):
    main = STACKS_MAIN.format(cls="Net", args="")
    assert [f[:3] for f in _findings(tmp_path, monkeypatch, {"models.py": EXP_MODEL, "main.py": main})] == [
        ("models.py", 12, "TD205")]


def test_log_softmax_into_nll_with_its_exp_for_accuracy_is_silent(tmp_path, monkeypatch):
    script = """import torch
import torch.nn as nn
import torch.nn.functional as F

fc = nn.Linear(8, 3)
x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
log_probs = F.log_softmax(fc(x), dim=1)
loss = F.nll_loss(log_probs, y)
accuracy = (log_probs.exp().argmax(1) == y).float().mean()
"""
    assert _findings(tmp_path, monkeypatch, {"train.py": script}) == []


METHOD_TRAINER = """from torch.nn import CrossEntropyLoss


class SupervisedTrainer(object):
    def __init__(self, loss_func=CrossEntropyLoss(), lr=0.1):
        self.loss_func = loss_func
        self.lr = lr

    def _train_batch(self, x, y, model):
        loss_func = self.loss_func
        outputs = model(x)
        if outputs.dim() == 1:
            outputs = outputs.unsqueeze(0)
        loss = loss_func(outputs, y)
        loss.backward()
        return loss

    def train(self, model, data, epochs=1):
        for _ in range(epochs):
            for x, y in data:
                self._train_batch(x, y, model)
"""

METHOD_MAIN = """import torch
from models import MLP
from trainer import SupervisedTrainer

model = MLP()
t = SupervisedTrainer(lr=0.01)
t.train(model, [(torch.randn(4, 8), torch.randint(0, 3, (4,)))])
"""


def test_a_model_handed_to_a_trainer_method_whose_default_criterion_is_cross_entropy(tmp_path, monkeypatch):
    # IBM dstc-noesis: `t.train(dual_encoder, ...)`, the trainer's `loss_func=CrossEntropyLoss()` kept on self
    files = {"models.py": MODELS, "trainer.py": METHOD_TRAINER, "main.py": METHOD_MAIN}
    assert [f[:3] for f in _findings(tmp_path, monkeypatch, files)] == [("models.py", SOFTMAX_LINE, "TD205")]


@pytest.mark.parametrize("change", ["logits model", "mse default"])
def test_a_trainer_method_twin_is_silent(tmp_path, monkeypatch, change):
    models, trainer = MODELS, METHOD_TRAINER
    if change == "logits model":
        models = LOGITS_MODELS
    else:
        trainer = trainer.replace("from torch.nn import CrossEntropyLoss", "from torch.nn import MSELoss").replace(
            "loss_func=CrossEntropyLoss()", "loss_func=MSELoss()")
    files = {"models.py": models, "trainer.py": trainer, "main.py": METHOD_MAIN}
    assert _findings(tmp_path, monkeypatch, files) == []


DISCRIMINATORS = """import torch.nn as nn


class _netD(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc_dis = nn.Linear(8, 1)
        self.fc_aux = nn.Linear(8, n)
        self.softmax = nn.Softmax(dim=1)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x):
        classes = self.softmax(self.fc_aux(x))
        realfake = self.sigmoid(self.fc_dis(x)).view(-1)
        return realfake, classes


class _netD_small(_netD):
    pass
"""

GAN_MAIN = """import sys
import torch
import torch.nn as nn
from network import _netD, _netD_small

if sys.argv[1] == "imagenet":
    netD = _netD(10)
else:
    netD = _netD_small(10)
aux_criterion = nn.NLLLoss()
dis_output, aux_output = netD(torch.randn(4, 8))
loss = aux_criterion(aux_output, torch.randint(0, 10, (4,)))
"""


def test_a_lower_case_discriminator_chosen_at_run_time_feeding_nll_its_softmax_member(tmp_path, monkeypatch):
    # ACGAN-PyTorch: `_netD` / `_netD_CIFAR10` by --dataset, the auxiliary softmax into NLLLoss
    found = _findings(tmp_path, monkeypatch, {"network.py": DISCRIMINATORS, "main.py": GAN_MAIN})
    assert [f[:3] for f in found] == [("network.py", 13, "TD205")]


def test_a_lower_case_discriminator_with_log_softmax_into_nll_is_silent(tmp_path, monkeypatch):
    network = DISCRIMINATORS.replace("nn.Softmax(dim=1)", "nn.LogSoftmax(dim=1)")
    assert _findings(tmp_path, monkeypatch, {"network.py": network, "main.py": GAN_MAIN}) == []

"""Call context across files (rules/static/callcontext.py): a function's callers in other files settle what the
function alone cannot, and a function with no known caller keeps today's finding. Static fixtures, real `check`."""

from __future__ import annotations

from torchdoctor.check import CheckRequest, build_report, prepare

# A validation helper in its own module, the model handed in (the shape of TimeSformer's and SimCLR's evaluation
# functions), called from the training script.
ENGINE = """import torch


def evaluate(model, loader, device):
    model.eval()
    correct = 0
    for images, labels in loader:
        outputs = model(images.to(device))
        correct += (outputs.argmax(1) == labels.to(device)).sum().item()
    return correct / len(loader.dataset)
"""
TRAIN = """import torch
from torch.utils.data import DataLoader

from engine import evaluate


def main(model, train_set, val_set, device):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=64)
    for epoch in range(10):
        model.train()
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            acc = evaluate(model, val_loader, device)
        print(epoch, acc)
"""
# A trainer class whose validation loop runs the dropout model it trains; the driver script decides the mode.
TRAINER = """import torch
from torch import nn


class Trainer:
    def __init__(self, train_loader, val_loader):
        self.model = nn.Sequential(nn.Linear(10, 10), nn.Dropout(0.5), nn.Linear(10, 2))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.train_loader = train_loader
        self.val_loader = val_loader

    def fit(self, epochs):
        self.model.train()
        for _ in range(epochs):
            for x, y in self.train_loader:
                self.optimizer.zero_grad()
                nn.functional.cross_entropy(self.model(x), y).backward()
                self.optimizer.step()

    def validate(self):
        correct = 0
        with torch.no_grad():
            for x, y in self.val_loader:
                correct += (self.model(x).argmax(1) == y).sum().item()
        return correct
"""
RUN = """from trainer import Trainer


def main(train_loader, val_loader):
    trainer = Trainer(train_loader, val_loader)
    trainer.fit(10)
    trainer.model.eval()
    print(trainer.validate())
"""


def _findings(tmp_path, monkeypatch, files: dict[str, str], code: str) -> list[tuple[str, int]]:
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    request = CheckRequest(paths=["."], fmt="json", fail_on="never")
    return [(f.path, f.line) for f in build_report(request, prepare(request)).findings if f.code == code]


def test_td102_every_caller_under_no_grad_settles_the_helper(tmp_path, monkeypatch):
    assert _findings(tmp_path, monkeypatch, {"engine.py": ENGINE, "train.py": TRAIN}, "TD102") == []


def test_td102_one_caller_with_grad_on_keeps_the_finding(tmp_path, monkeypatch):
    second = TRAIN + "\n\ndef report(model, val_set, device):\n    print(evaluate(model, DataLoader(val_set), device))\n"
    assert _findings(tmp_path, monkeypatch, {"engine.py": ENGINE, "train.py": second}, "TD102") == [("engine.py", 8)]


def test_td102_a_grad_on_call_before_the_no_grad_one_keeps_the_finding(tmp_path, monkeypatch):
    # the file answers per callee once a call disagrees (callsites.py): a later agreeing call must not undo that
    first = TRAIN.replace("def main(", "def report(model, val_set, device):\n    print(evaluate(model, DataLoader(val_set), "
                                       "device))\n\n\ndef main(")
    assert _findings(tmp_path, monkeypatch, {"engine.py": ENGINE, "train.py": first}, "TD102") == [("engine.py", 8)]


def test_td102_no_known_caller_reports_as_one_file_would(tmp_path, monkeypatch):
    assert _findings(tmp_path, monkeypatch, {"engine.py": ENGINE}, "TD102") == [("engine.py", 8)]


def test_td102_a_same_named_function_of_another_module_is_not_a_caller(tmp_path, monkeypatch):
    other = "def evaluate(model, loader, device):\n    return 0.0\n"
    train = TRAIN.replace("from engine import evaluate", "from metrics import evaluate")
    found = _findings(tmp_path, monkeypatch, {"engine.py": ENGINE, "metrics.py": other, "train.py": train}, "TD102")
    assert found == [("engine.py", 8)]


def test_td601_eval_before_every_call_settles_the_validation_method(tmp_path, monkeypatch):
    assert _findings(tmp_path, monkeypatch, {"trainer.py": TRAINER, "run.py": RUN}, "TD601") == []


def test_td601_a_call_without_eval_keeps_the_finding(tmp_path, monkeypatch):
    run = RUN.replace("    trainer.model.eval()\n", "")
    assert _findings(tmp_path, monkeypatch, {"trainer.py": TRAINER, "run.py": run}, "TD601") == [("trainer.py", 24)]


# A trainer that sets up the process group and writes its weights in a method not named for saving; the driver
# calls it on rank 0 only (the shape of pytorch/examples' ddp-tutorial `_save_checkpoint`, across two files).
DDP_TRAINER = """import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, model):
        dist.init_process_group("nccl")
        self.model = model

    def end_epoch(self, epoch):
        torch.save(self.model.state_dict(), f"weights_{epoch}.pt")
"""
DDP_RUN = """import torch.distributed as dist

from trainer import Trainer


def main(model, epochs):
    trainer = Trainer(model)
    for epoch in range(epochs):
        if dist.get_rank() == 0:
            trainer.end_epoch(epoch)
"""


def test_td303_every_call_on_rank_zero_settles_the_save(tmp_path, monkeypatch):
    assert _findings(tmp_path, monkeypatch, {"trainer.py": DDP_TRAINER, "run.py": DDP_RUN}, "TD303") == []


def test_td303_an_unguarded_call_keeps_the_save(tmp_path, monkeypatch):
    run = DDP_RUN.replace("        if dist.get_rank() == 0:\n            trainer", "        trainer")
    assert _findings(tmp_path, monkeypatch, {"trainer.py": DDP_TRAINER, "run.py": run}, "TD303") == [("trainer.py", 11)]


# Lightning is the caller of its hooks: the evaluation loop runs `on_validation_epoch_end` under no_grad (or
# inference_mode) after `model.eval()` (lightning/pytorch/loops/evaluation_loop.py).
LIGHTNING = """import torch
from torch import nn
import lightning as L


class LitModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 10), nn.Dropout(0.5), nn.Linear(10, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def on_validation_epoch_end(self):
        loader = self.trainer.datamodule.val_dataloader()
        for x, y in loader:
            out = self.net(x)
            self.log("acc", (out.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())
"""


def test_lightning_evaluation_hooks_run_with_grad_off_in_eval_mode(tmp_path, monkeypatch):
    files = {"lit.py": LIGHTNING}
    assert _findings(tmp_path, monkeypatch, files, "TD102") == _findings(tmp_path, monkeypatch, files, "TD601") == []


def test_the_same_hook_name_on_a_plain_module_is_not_lightning_s(tmp_path, monkeypatch):
    plain = {"plain.py": LIGHTNING.replace("import lightning as L\n", "").replace("L.LightningModule", "nn.Module")}
    assert _findings(tmp_path, monkeypatch, plain, "TD102") == [("plain.py", 17)]
    assert _findings(tmp_path, monkeypatch, plain, "TD601") == [("plain.py", 17)]


def test_td102_a_function_handed_on_as_a_value_elsewhere_keeps_the_finding(tmp_path, monkeypatch):
    train = TRAIN + "\n\ndef hooks(register):\n    register(evaluate)\n"
    assert _findings(tmp_path, monkeypatch, {"engine.py": ENGINE, "train.py": train}, "TD102") == [("engine.py", 8)]


def test_td102_a_function_handed_on_as_a_value_in_its_own_file_keeps_the_finding(tmp_path, monkeypatch):
    engine = ENGINE + "\n\nEVALUATORS = {\"accuracy\": evaluate}\n"
    assert _findings(tmp_path, monkeypatch, {"engine.py": engine, "train.py": TRAIN}, "TD102") == [("engine.py", 8)]


# CenterNet's shape: one `run_epoch(phase, ...)` serves both phases, stepping only for 'train'; the class's `val()`
# runs it for 'val', and the driver script in another file decides whether that runs under no_grad.
PHASE_TRAINER = """import torch


class BaseTrainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def run_epoch(self, phase, data_loader):
        if phase == "train":
            self.model.train()
        else:
            self.model.eval()
        for batch in data_loader:
            loss = self.model(batch).mean()
            if phase == "train":
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()

    def val(self, data_loader):
        return self.run_epoch("val", data_loader)

    def train(self, data_loader):
        return self.run_epoch("train", data_loader)
"""
PHASE_MAIN = """import torch

from trainer import BaseTrainer


def main(model, optimizer, train_loader, val_loader):
    trainer = BaseTrainer(model, optimizer)
    for epoch in range(10):
        trainer.train(train_loader)
        with torch.no_grad():
            trainer.val(val_loader)
"""


def test_td102_a_phase_parameter_s_evaluation_call_settled_by_the_callers_of_another_file(tmp_path, monkeypatch):
    files = {"trainer.py": PHASE_TRAINER, "main.py": PHASE_MAIN}
    assert _findings(tmp_path, monkeypatch, files, "TD102") == []
    unguarded = PHASE_MAIN.replace("        with torch.no_grad():\n            trainer.val", "        trainer.val")
    files = {"trainer.py": PHASE_TRAINER, "main.py": unguarded}
    assert _findings(tmp_path, monkeypatch, files, "TD102") == [("trainer.py", 15)]

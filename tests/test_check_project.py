"""The project pass: rules that join files (rules/static/project.py), checked on real little trees."""

from __future__ import annotations

import pytest

from torchdoctor.check import CheckRequest, build_report, prepare

SETUP = """import torch.distributed as dist


def setup(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
"""
MAIN_BINDS = """import torch

from utils import setup


def main(local_rank, world_size):
    setup(local_rank, world_size)
    torch.cuda.set_device(local_rank)
"""


def _findings(tmp_path, monkeypatch, files: dict[str, str], paths=(".",)):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    request = CheckRequest(paths=list(paths), fmt="json", fail_on="never")
    return [(f.path, f.line, f.code) for f in build_report(request, prepare(request)).findings]


def test_set_device_in_another_file_binds_the_process_group(tmp_path, monkeypatch):
    assert _findings(tmp_path, monkeypatch, {"utils.py": SETUP, "main.py": MAIN_BINDS}) == []


def test_nccl_without_set_device_anywhere_is_found_in_the_file_that_initialises(tmp_path, monkeypatch):
    main = MAIN_BINDS.replace("    torch.cuda.set_device(local_rank)\n", "")
    assert _findings(tmp_path, monkeypatch, {"utils.py": SETUP, "main.py": main}) == [("utils.py", 5, "TD306")]


@pytest.mark.parametrize("order", [["main.py", "utils.py"], ["utils.py", "main.py"]])
def test_the_result_does_not_depend_on_the_order_files_are_named(tmp_path, monkeypatch, order):
    assert _findings(tmp_path, monkeypatch, {"utils.py": SETUP, "main.py": MAIN_BINDS}, order) == []


EVAL = """import torch


def eval_net(net, loader, device):
    net.eval()
    total = 0.0
    for x, y in loader:
        with torch.no_grad():
            total += torch.nn.functional.cross_entropy(net(x.to(device)), y.to(device)).item()
    return total / len(loader)
"""
TRAIN = """import torch

from eval import eval_net


def train_net(net, train_loader, val_loader, optimizer, device, epochs):
    for epoch in range(epochs):
        net.train()
        for step, (x, y) in enumerate(train_loader):
            loss = torch.nn.functional.cross_entropy(net(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                val_score = eval_net(net, val_loader, device)
"""


def test_an_evaluation_in_another_file_that_never_restores_train_mode(tmp_path, monkeypatch):
    found = _findings(tmp_path, monkeypatch, {"eval.py": EVAL, "train.py": TRAIN})
    assert found == [("train.py", 15, "TD602")]


def test_an_evaluation_in_another_file_that_restores_train_mode(tmp_path, monkeypatch):
    restored = EVAL.replace("    return total / len(loader)", "    net.train()\n    return total / len(loader)")
    assert _findings(tmp_path, monkeypatch, {"eval.py": restored, "train.py": TRAIN}) == []
    restored_by_caller = TRAIN.replace("val_loader, device)\n", "val_loader, device)\n                net.train()\n")
    assert _findings(tmp_path, monkeypatch, {"eval.py": EVAL, "train.py": restored_by_caller}) == []


MODEL = """import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(100, 10)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=-1)
"""
TRAINER = """import torch.nn as nn


def source_only(encoder, classifier, loader, optimizer):
    criterion = nn.CrossEntropyLoss()
    for x, y in loader:
        class_pred = classifier(encoder(x))
        loss = criterion(class_pred, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
ENTRY = """import torch

import model
import trainer

encoder = torch.nn.Linear(784, 100)
classifier = model.Classifier()
optimizer = torch.optim.SGD(list(encoder.parameters()) + list(classifier.parameters()), lr=0.01)
trainer.source_only(encoder, classifier, [], optimizer)
"""


def test_a_softmax_model_from_one_file_trained_with_cross_entropy_in_another(tmp_path, monkeypatch):
    files = {"model.py": MODEL, "trainer.py": TRAINER, "main.py": ENTRY}
    assert _findings(tmp_path, monkeypatch, files) == [("model.py", 11, "TD205")]


def test_the_same_model_returning_logits_is_quiet(tmp_path, monkeypatch):
    files = {"model.py": MODEL.replace("F.softmax(self.fc(x), dim=-1)", "self.fc(x)"), "trainer.py": TRAINER, "main.py": ENTRY}
    assert _findings(tmp_path, monkeypatch, files) == []


# musikalkemist/pytorchforaudio: the entry point hands the model to `train`, which hands it on to
# `train_single_epoch`, where its output meets the CrossEntropyLoss it was also handed.
CHAINED = """import torch
import torch.nn as nn

from model import Classifier


def train_single_epoch(net, loader, loss_fn, optimiser):
    for x, y in loader:
        prediction = net(x)
        loss = loss_fn(prediction, y)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()


def train(net, loader, loss_fn, optimiser, epochs):
    for _ in range(epochs):
        train_single_epoch(net, loader, loss_fn, optimiser)


if __name__ == "__main__":
    classifier = Classifier()
    loss_fn = nn.CrossEntropyLoss()
    optimiser = torch.optim.Adam(classifier.parameters(), lr=1e-3)
    train(classifier, [], loss_fn, optimiser, 10)
"""


def test_a_softmax_model_handed_through_two_functions_to_cross_entropy(tmp_path, monkeypatch):
    assert _findings(tmp_path, monkeypatch, {"model.py": MODEL, "train.py": CHAINED}) == [("model.py", 11, "TD205")]


def test_the_chain_is_quiet_when_the_helper_scores_the_output_with_another_loss(tmp_path, monkeypatch):
    mse = CHAINED.replace("nn.CrossEntropyLoss()", "nn.MSELoss()")
    assert _findings(tmp_path, monkeypatch, {"model.py": MODEL, "train.py": mse}) == []
    # the model is handed on, but in the slot of something else (the loader), not the one whose output is scored
    swapped = CHAINED.replace("        train_single_epoch(net, loader,", "        train_single_epoch(loader, net,")
    assert ("model.py", 11, "TD205") not in _findings(tmp_path, monkeypatch, {"model.py": MODEL, "train.py": swapped})


DATASET = """import numpy as np
import torch
from torch.utils import data


class RawDataset(data.Dataset):
    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return torch.from_numpy(np.load(self.files[i]))
"""
TRAIN_NO_WORKERS = """import torch
from torch.utils.data import DataLoader

from datasets.raw import RawDataset


def main(files, model, optimizer):
    train_set = RawDataset(files)
    train_loader = DataLoader(train_set, batch_size=4, shuffle=True, num_workers=0, pin_memory=True)
    for epoch in range(10):
        for x in train_loader:
            x = x.cuda(non_blocking=True)
            loss = model(x).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


@pytest.mark.parametrize("paths", [(".",), ("train.py", "datasets")])
def test_a_loader_without_workers_over_a_dataset_class_of_another_file_that_loads_files(tmp_path, monkeypatch, paths):
    files = {"datasets/__init__.py": "", "datasets/raw.py": DATASET, "train.py": TRAIN_NO_WORKERS}
    assert ("train.py", 9, "TD501") in _findings(tmp_path, monkeypatch, files, paths)


def test_a_loader_without_workers_over_a_cheap_dataset_of_another_file_is_quiet(tmp_path, monkeypatch):
    cheap = DATASET.replace("torch.from_numpy(np.load(self.files[i]))", "self.files[i]")
    files = {"datasets/__init__.py": "", "datasets/raw.py": cheap, "train.py": TRAIN_NO_WORKERS}
    assert [f for f in _findings(tmp_path, monkeypatch, files, ("train.py", "datasets")) if f[2] == "TD501"] == []


EVALUATE = """import os

from torch.utils.data import DataLoader

from data import ImageFolderDataset


def test(cfg, model=None, batch_size=16):
    dataset = ImageFolderDataset(cfg["valid"])
    dataloader = DataLoader(dataset, batch_size=batch_size, num_workers=min(os.cpu_count(), 8))
    model.eval()
    return [model(x) for x in dataloader]
"""
TRAIN_CALLS_TEST = """import torch

import test


def train(cfg, model, loader, optimizer, epochs, opt):
    for epoch in range(epochs):
        for x in loader:
            optimizer.zero_grad()
            model(x).mean().backward()
            optimizer.step()
        final_epoch = epoch + 1 == epochs
        if not opt.notest or final_epoch:
            with torch.no_grad():
                results = test.test(cfg, model=model)
"""


def test_a_loader_built_in_a_function_another_file_calls_every_epoch(tmp_path, monkeypatch):
    files = {"test.py": EVALUATE, "train.py": TRAIN_CALLS_TEST}
    assert ("test.py", 10, "TD508") in _findings(tmp_path, monkeypatch, files)


def test_a_loader_built_in_a_function_called_every_tenth_epoch_is_quiet(tmp_path, monkeypatch):
    train = TRAIN_CALLS_TEST.replace("if not opt.notest or final_epoch:", "if epoch % 10 == 0:")
    files = {"test.py": EVALUATE, "train.py": train}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD508"] == []


DATASETS = """from torch.utils.data import DataLoader

from utils.data import TTSDataset, collate_tts


def get_tts_datasets(path, batch_size, r, epoch=0):
    train_dataset = TTSDataset(path)
    train_set = DataLoader(train_dataset, collate_fn=lambda batch: collate_tts(batch, r),
                           batch_size=batch_size, num_workers=1, pin_memory=True)
    return train_set
"""
TRAIN_PER_SESSION = """from utils.dataset import get_tts_datasets

SCHEDULE = [(7, 1e-3, 10_000, 32), (5, 1e-4, 20_000, 32), (2, 1e-4, 40_000, 16)]


def main(paths, model, optimizer):
    for i, session in enumerate(SCHEDULE):
        r, lr, max_step, batch_size = session
        model.r = r
        train_set = get_tts_datasets(paths.data, batch_size, r)
        for x, m in train_set:
            optimizer.zero_grad()
            model(x, m).mean().backward()
            optimizer.step()
"""


def test_a_loader_shaped_by_what_each_pass_hands_the_builder_is_quiet(tmp_path, monkeypatch):
    # From WaveRNN (train_tacotron.py, utils/dataset.py): each session of the schedule has its own batch size and
    # reduction factor, and the builder makes the loader from them: a new loader per session is the point.
    files = {"utils/__init__.py": "", "utils/dataset.py": DATASETS, "train.py": TRAIN_PER_SESSION}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD508"] == []


def test_a_varying_argument_the_loader_does_not_use_does_not_excuse_it(tmp_path, monkeypatch):
    train = TRAIN_PER_SESSION.replace("get_tts_datasets(paths.data, batch_size, r)",
                                      "get_tts_datasets(paths.data, 32, 2, epoch=i)")
    files = {"utils/__init__.py": "", "utils/dataset.py": DATASETS, "train.py": train}
    assert ("utils/dataset.py", 8, "TD508") in _findings(tmp_path, monkeypatch, files)


BASE_MODEL = """import torch
from torch.nn.parallel import DistributedDataParallel


class BaseModel:
    def __init__(self, net, rank):
        self.net = DistributedDataParallel(net, device_ids=[rank])

    def save_networks(self, epoch):
        torch.save(self.net.module.state_dict(), f"{epoch}_net.pth")
"""
TRAIN_SAVES = """import torch
import torch.distributed as dist

from models.base_model import BaseModel


def train_gpu(rank, world_size, net, loader, optimizer, epochs):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    model = BaseModel(net, rank)
    rank_0 = rank == 0
    for epoch in range(epochs):
        for x in loader:
            optimizer.zero_grad()
            model.net(x).mean().backward()
            optimizer.step()
        if rank_0:
            model.save_networks(epoch)
"""


def test_a_save_method_called_under_a_rank_guard_in_another_file_is_quiet(tmp_path, monkeypatch):
    files = {"models/__init__.py": "", "models/base_model.py": BASE_MODEL, "train.py": TRAIN_SAVES}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD303"] == []


def test_a_save_method_called_on_every_rank_from_another_file_is_found(tmp_path, monkeypatch):
    train = TRAIN_SAVES.replace("        if rank_0:\n            model.save_networks(epoch)", "        model.save_networks(epoch)")
    files = {"models/__init__.py": "", "models/base_model.py": BASE_MODEL, "train.py": train}
    assert ("models/base_model.py", 10, "TD303") in _findings(tmp_path, monkeypatch, files)


SUBCLASS_MODEL = """import torch

from models.base_model import BaseModel


class LoraModel(BaseModel):
    def save_networks(self, epoch):
        if not self.merge:
            super().save_networks(epoch)
            return
        torch.save(self.net.module.state_dict(), f"{epoch}_merged.pth")
"""


def test_an_override_calling_super_does_not_count_as_an_unguarded_call(tmp_path, monkeypatch):
    files = {"models/__init__.py": "", "models/base_model.py": BASE_MODEL, "models/lora_model.py": SUBCLASS_MODEL,
             "train.py": TRAIN_SAVES}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD303"] == []


NETWORK = """import torch.nn as nn
import torch.nn.functional as F


class Network(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 6)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=1)
"""
MAIN_LOCAL_TRAIN = """import torch
import torch.nn as nn

import network as net


def train(model, optimizer, loader):
    criterion = nn.CrossEntropyLoss()
    for sample, target in loader:
        output = model(sample)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    model = net.Network()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, optimizer, [])
"""


def test_a_softmax_model_of_another_file_trained_by_a_function_of_the_same_file(tmp_path, monkeypatch):
    files = {"network.py": NETWORK, "main.py": MAIN_LOCAL_TRAIN}
    assert ("network.py", 11, "TD205") in _findings(tmp_path, monkeypatch, files)


TRAINER_RETURNS_LOSSES = """from collections import namedtuple

import torch.nn as nn

LossTuple = namedtuple("LossTuple", ["rpn_loss", "roi_loss", "total_loss"])


class Trainer(nn.Module):
    def __init__(self, net, optimizer):
        super().__init__()
        self.net, self.optimizer = net, optimizer

    def forward(self, imgs, targets):
        rpn, roi = self.net(imgs, targets)
        return LossTuple(rpn, roi, rpn + roi)

    def train_step(self, imgs, targets):
        self.optimizer.zero_grad()
        losses = self.forward(imgs, targets)
        losses.total_loss.backward()
        self.optimizer.step()
        return losses
"""
FIT_ADDS_THEM = """from trainer import Trainer


def fit_one_epoch(train_util: Trainer, gen):
    total_loss = 0
    for iteration, (imgs, targets) in enumerate(gen):
        losses = train_util.train_step(imgs, targets)
        rpn, roi, total = losses
        total_loss += total
    return total_loss
"""


def test_losses_returned_with_their_graph_by_another_files_train_step_and_added_up(tmp_path, monkeypatch):
    files = {"trainer.py": TRAINER_RETURNS_LOSSES, "train.py": FIT_ADDS_THEM}
    assert ("train.py", 9, "TD101") in _findings(tmp_path, monkeypatch, files)


def test_losses_added_up_as_numbers_are_quiet(tmp_path, monkeypatch):
    fit = FIT_ADDS_THEM.replace("total_loss += total", "total_loss += total.item()")
    files = {"trainer.py": TRAINER_RETURNS_LOSSES, "train.py": fit}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD101"] == []


SCHEDULES = """import math


class WarmupCosineSchedule(object):
    def __init__(self, optimizer, warmup_steps, ref_lr, T_max):
        self.optimizer, self.warmup_steps, self.ref_lr, self.T_max = optimizer, warmup_steps, ref_lr, T_max
        self._step = 0

    def step(self):
        self._step += 1
        new_lr = self.ref_lr * 0.5 * (1.0 + math.cos(math.pi * self._step / self.T_max))
        for group in self.optimizer.param_groups:
            group["lr"] = new_lr
        return new_lr
"""
TORCH_SCHEDULES = """import torch


class WarmupCosineSchedule(torch.optim.lr_scheduler.LambdaLR):
    def __init__(self, optimizer, warmup_steps, ref_lr, T_max):
        super().__init__(optimizer, lambda step: min(1.0, step / warmup_steps))
"""
EVAL_LOOP = """import torch

from utils.schedulers import WarmupCosineSchedule


def init_opt(classifier, iterations_per_epoch, num_epochs):
    optimizer = torch.optim.AdamW(classifier.parameters())
    scaler = torch.amp.GradScaler("cuda")
    scheduler = WarmupCosineSchedule(optimizer, warmup_steps=10, ref_lr=1e-3, T_max=num_epochs * iterations_per_epoch)
    return optimizer, scaler, scheduler


def run_one_epoch(classifier, data_loader, iterations_per_epoch, num_epochs):
    optimizer, scaler, scheduler = init_opt(classifier, iterations_per_epoch, num_epochs)
    for imgs, labels in data_loader:
        scheduler.step()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(classifier(imgs), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""


def test_a_schedule_class_of_the_project_stepped_first_is_quiet(tmp_path, monkeypatch):
    """V-JEPA evals: the schedule is the project's own plain class (utils/schedulers.py), which sets the learning
    rate for the step about to run; PyTorch never checks its order."""
    files = {"utils/schedulers.py": SCHEDULES, "eval.py": EVAL_LOOP}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD408"] == []


@pytest.mark.parametrize("schedules", [TORCH_SCHEDULES, None])
def test_a_schedule_class_on_a_torch_base_or_not_found_stepped_first_is_found(tmp_path, monkeypatch, schedules):
    files = {"eval.py": EVAL_LOOP, **({"utils/schedulers.py": schedules} if schedules else {})}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD408"] == [("eval.py", 16, "TD408")]
# pl_bolts' shape: a classifier head from a package module (re-exported by the package's __init__), kept on
# `self` by a LightningModule, or set on the module a callback is handed; the loss sits in another file.
HEAD = """from torch import nn


class SSLEvaluator(nn.Module):
    def __init__(self, n_input, n_classes, n_hidden=512):
        super().__init__()
        self.block_forward = nn.Sequential(
            nn.Linear(n_input, n_hidden),
            nn.ReLU(inplace=True),
            nn.Linear(n_hidden, n_classes),
            nn.Softmax(),
        )

    def forward(self, x):
        logits = self.block_forward(x)
        return logits
"""
FINETUNER = """import torch.nn.functional as F
from torch import nn

from pl_bolts.models.ssl import SSLEvaluator


class SSLFineTuner(nn.Module):
    def __init__(self, backbone, in_features, num_classes):
        super().__init__()
        self.backbone = backbone
        self.linear_layer = SSLEvaluator(n_input=in_features, n_classes=num_classes)

    def shared_step(self, batch):
        x, y = batch
        feats = self.backbone(x)
        logits = self.linear_layer(feats)
        return F.cross_entropy(logits, y)
"""
CALLBACK = """import torch.nn.functional as F


class OnlineEvaluator:
    def on_pretrain_routine_start(self, trainer, pl_module):
        from pl_bolts.models.ssl.evaluator import SSLEvaluator

        pl_module.non_linear_evaluator = SSLEvaluator(n_input=64, n_classes=10).to(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, batch):
        x, y = batch
        preds = pl_module.non_linear_evaluator(x)
        loss = F.cross_entropy(preds, y)
        loss.backward()
"""


def test_a_head_built_from_a_package_module_on_self_is_joined_to_its_softmax(tmp_path, monkeypatch):
    files = {"ssl/__init__.py": "from pl_bolts.models.ssl.evaluator import SSLEvaluator\n",
             "ssl/evaluator.py": HEAD, "ssl/finetuner.py": FINETUNER}
    assert ("ssl/evaluator.py", 11, "TD205") in _findings(tmp_path, monkeypatch, files, ["ssl"])


def test_a_head_set_on_the_module_a_callback_is_handed_is_joined_to_its_softmax(tmp_path, monkeypatch):
    files = {"ssl/evaluator.py": HEAD, "callbacks/online.py": CALLBACK}
    assert ("ssl/evaluator.py", 11, "TD205") in _findings(tmp_path, monkeypatch, files)


def test_the_same_head_returning_logits_is_quiet(tmp_path, monkeypatch):
    files = {"ssl/__init__.py": "from pl_bolts.models.ssl.evaluator import SSLEvaluator\n",
             "ssl/evaluator.py": HEAD.replace("            nn.Softmax(),\n", ""), "ssl/finetuner.py": FINETUNER,
             "callbacks/online.py": CALLBACK}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD205"] == []


# snowfall's shape (#110): a library module writes the checkpoint; the recipe script steps a (Noam) optimizer in
# its epoch loop, calls the writer without it, and resumes from `start_epoch` through the library's loader.
COMMON = """import torch


def load_checkpoint(filename, model):
    checkpoint = torch.load(filename, map_location="cpu")
    model.load_state_dict(checkpoint["state_dict"])
    return checkpoint


def save_checkpoint(filename, model, epoch, learning_rate, objf):
    checkpoint = {
        "state_dict": model.state_dict(),
        "epoch": epoch,
        "learning_rate": learning_rate,
        "objf": objf,
    }
    torch.save(checkpoint, filename)
"""
RECIPE = """import torch

from snowfall.common import load_checkpoint, save_checkpoint
from snowfall.training import Noam


def main(model, loader, start_epoch, num_epochs):
    if start_epoch > 0:
        load_checkpoint(filename=f"epoch-{start_epoch - 1}.pt", model=model)
    optimizer = Noam(model.parameters(), model_size=256, factor=1.0, warm_step=25000)
    for epoch in range(start_epoch, num_epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        save_checkpoint(filename=f"epoch-{epoch}.pt", model=model, epoch=epoch, learning_rate=1e-3, objf=0.0)
"""


def test_a_library_checkpoint_writer_without_the_optimizer_of_a_resuming_recipe(tmp_path, monkeypatch):
    files = {"snowfall/common.py": COMMON, "egs/train.py": RECIPE}
    assert ("snowfall/common.py", 17, "TD701") in _findings(tmp_path, monkeypatch, files)


def test_the_writer_handed_the_optimizer_is_quiet(tmp_path, monkeypatch):
    common = COMMON.replace("learning_rate, objf):", "learning_rate, objf, optimizer=None):").replace(
        '"objf": objf,', '"objf": objf,\n        "optimizer": optimizer.state_dict() if optimizer else None,')
    recipe = RECIPE.replace("objf=0.0)", "objf=0.0, optimizer=optimizer)")
    files = {"snowfall/common.py": common, "egs/train.py": recipe}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD701"] == []


def test_a_recipe_that_never_resumes_is_quiet(tmp_path, monkeypatch):
    recipe = RECIPE.replace("from snowfall.common import load_checkpoint, save_checkpoint",
                            "from snowfall.common import save_checkpoint").replace(
        '    if start_epoch > 0:\n        load_checkpoint(filename=f"epoch-{start_epoch - 1}.pt", model=model)\n', "").replace(
        "start_epoch, num_epochs", "num_epochs").replace("range(start_epoch, num_epochs)", "range(num_epochs)")
    files = {"snowfall/common.py": COMMON, "egs/train.py": recipe}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD701"] == []


HOOK_UTIL = '''\
import torch


def enable_gradient_clipping(model, grad_clipping):
    if grad_clipping is not None:
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.register_hook(lambda grad: torch.clamp(grad, -grad_clipping, grad_clipping))
'''

HOOK_TRAINER = '''\
import torch
from torch.cuda import amp

from training import util as training_util


class Trainer:
    def __init__(self, model, optimizer, loader, grad_clipping=1.0, use_amp=True):
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self._grad_clipping = grad_clipping
        self._scaler = amp.GradScaler() if use_amp else None

    def train(self, epochs):
        training_util.enable_gradient_clipping(self.model, self._grad_clipping)
        for epoch in range(epochs):
            for x, y in self.loader:
                self.optimizer.zero_grad()
                with amp.autocast():
                    loss = torch.nn.functional.mse_loss(self.model(x.cuda()), y.cuda())
                self._scaler.scale(loss).backward()
                self._scaler.step(self.optimizer)
                self._scaler.update()
'''


def test_clipping_hooks_from_another_file_under_a_grad_scaler(tmp_path, monkeypatch):
    # allennlp's trainer before its fix: the hooks clamp gradients still multiplied by the loss scale.
    files = {"training/util.py": HOOK_UTIL, "training/trainer.py": HOOK_TRAINER}
    assert ("training/trainer.py", 14, "TD403") in _findings(tmp_path, monkeypatch, files)


def test_clipping_hooks_without_a_grad_scaler_are_quiet(tmp_path, monkeypatch):
    plain = HOOK_TRAINER.replace("amp.GradScaler() if use_amp else None", "None").replace(
        "self._scaler.scale(loss).backward()\n                self._scaler.step(self.optimizer)\n"
        "                self._scaler.update()", "loss.backward()\n                self.optimizer.step()")
    files = {"training/util.py": HOOK_UTIL, "training/trainer.py": plain}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD403"] == []


SAVE_HELPER = """import os

import torch


def save_checkpoint(model, optimizer, epoch, path):
    torch.save(model.state_dict(), os.path.join(path, "model.pt"))
    torch.save(optimizer.state_dict(), os.path.join(path, "optimizer.pt"))
"""
RESUME = """import os

import torch

import utils


def main(model, optimizer, args):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.continue_train:
        model.load_state_dict(torch.load(os.path.join(args.save, "model.pt")))
    model.to(device)
    utils.save_checkpoint(model, optimizer, 0, args.save)
"""


def test_a_resume_of_the_file_a_save_helper_writes_in_another_file_is_quiet(tmp_path, monkeypatch):
    # darts rnn/train.py resumes `args.save/model.pt`, written by utils.save_checkpoint in the same run
    files = {"utils.py": SAVE_HELPER, "train.py": RESUME}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD703"] == []


def test_a_load_of_a_file_no_file_of_the_project_writes_is_found(tmp_path, monkeypatch):
    files = {"utils.py": SAVE_HELPER.replace('"model.pt"', '"last.pt"'), "train.py": RESUME}
    assert ("train.py", 11, "TD703") in _findings(tmp_path, monkeypatch, files)


def test_the_resume_checked_alone_is_found(tmp_path, monkeypatch):
    files = {"utils.py": SAVE_HELPER, "train.py": RESUME}
    assert ("train.py", 11, "TD703") in _findings(tmp_path, monkeypatch, files, paths=("train.py",))


BASE_TRAINER = """import torch
from torch import nn


class Trainer:
    def __init__(self):
        self.network = nn.Linear(4, 4)
        self.optimizer = torch.optim.SGD(self.network.parameters(), lr=0.1)

    def save_checkpoint(self, filename):
        torch.save({"network_weights": self.network.state_dict(),
                    "optimizer_state": self.optimizer.state_dict()}, filename)
"""
VARIANT_TRAINER = """import torch

from trainers.base import Trainer


class WarmupTrainer(Trainer):
    def load_checkpoint(self, checkpoint):
        if isinstance(checkpoint, str):
            checkpoint = torch.load(checkpoint, map_location="cpu", weights_only=False)
        self.network.load_state_dict(checkpoint["network_weights"])
        self.optimizer.load_state_dict(checkpoint["optimizer_state"])
"""


def test_a_load_checkpoint_override_reading_what_a_base_class_of_another_file_saves_is_quiet(tmp_path, monkeypatch):
    # nnU-Net's trainer variants override load_checkpoint; save_checkpoint is nnUNetTrainer's, in another file.
    files = {"trainers/__init__.py": "", "trainers/base.py": BASE_TRAINER, "trainers/warmup.py": VARIANT_TRAINER}
    assert _findings(tmp_path, monkeypatch, files) == []


def test_a_load_checkpoint_override_whose_bases_save_nothing_is_found(tmp_path, monkeypatch):
    files = {"trainers/__init__.py": "", "trainers/base.py": BASE_TRAINER.replace("save_checkpoint", "export"),
             "trainers/warmup.py": VARIANT_TRAINER}
    assert _findings(tmp_path, monkeypatch, files) == [("trainers/warmup.py", 9, "TD702")]


# OpenGVLab/efficient-video-recognition (issue #18): checkpoint.py writes with torch.save and sets up nothing;
# main.py sets up DDP and calls it every N steps with no rank test, so every process writes the same file.
CKPT_HELPER = """import os

import torch


def save_checkpoint(model, optimizer, step, out_dir):
    to_save = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "next_step": step}
    torch.save(to_save, os.path.join(out_dir, f"checkpoint-{step}.pth"))
"""
DDP_MAIN = """import torch
import torch.distributed as dist

import checkpoint


def main(args):
    dist.init_process_group("nccl")
    torch.cuda.set_device(args.local_rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(args.loader):
        loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (i + 1) % args.save_freq == 0:
            checkpoint.save_checkpoint(model, optimizer, i + 1, args.out_dir)
"""


def test_a_save_helper_of_another_file_called_on_every_rank(tmp_path, monkeypatch):
    found = _findings(tmp_path, monkeypatch, {"checkpoint.py": CKPT_HELPER, "main.py": DDP_MAIN})
    assert found == [("main.py", 18, "TD303")]


def test_the_helper_call_is_quiet_under_a_rank_test_or_when_the_helper_tests_the_rank(tmp_path, monkeypatch):
    guarded = DDP_MAIN.replace("if (i + 1) % args.save_freq == 0:", "if (i + 1) % args.save_freq == 0 and dist.get_rank() == 0:")
    assert _findings(tmp_path, monkeypatch, {"checkpoint.py": CKPT_HELPER, "main.py": guarded}) == []
    self_guarded = CKPT_HELPER.replace("    to_save =", "    if torch.distributed.get_rank() != 0:\n        return\n    to_save =")
    assert _findings(tmp_path, monkeypatch, {"checkpoint.py": self_guarded, "main.py": DDP_MAIN}) == []


TEST_SEG = """import torch


def test_seg(model, loader):
    correct = 0
    for points, target in loader:
        pred = model(points)
        correct += (pred.argmax(-1) == target).sum().item()
    return correct
"""
TRAIN_SEG = """import torch
import torch.nn.functional as F

from model import Net
from utils import test_seg


def main(train_loader, test_loader):
    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(10):
        for points, target in train_loader:
            optimizer.zero_grad()
            model = model.train()
            loss = F.nll_loss(model(points), target)
            loss.backward()
            optimizer.step()
        print(epoch, test_seg(model, test_loader))
"""


def test_a_validation_function_of_another_file_runs_the_model_its_caller_left_in_training_mode(tmp_path, monkeypatch):
    # GACNet (issue #8): train_semseg.py calls model.train() in its training loop, then utils.test_seg(model, ...),
    # which never calls .eval()
    files = {"utils.py": TEST_SEG, "train_semseg.py": TRAIN_SEG, "model.py": "import torch\n\n\nclass Net(torch.nn.Module):\n    pass\n"}
    found = [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD601"]
    assert found == [("utils.py", 7, "TD601")]


def test_the_caller_switching_to_eval_before_the_call_keeps_the_validation_function_quiet(tmp_path, monkeypatch):
    fixed = TRAIN_SEG.replace("        print(epoch, test_seg(", "        model.eval()\n        print(epoch, test_seg(")
    files = {"utils.py": TEST_SEG, "train_semseg.py": fixed, "model.py": "import torch\n\n\nclass Net(torch.nn.Module):\n    pass\n"}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD601"] == []


SAVING_BASE = """import torch


class BaseTrainer:
    def _save_checkpoint(self, tag):
        torch.save({"model": self.model.state_dict()}, f"{self.save_dir}/checkpoint_{tag}.pth")

    def save_checkpoint(self, epoch):
        return self._save_checkpoint(str(epoch))

    def save_best_checkpoint(self):
        return self._save_checkpoint("best")
"""
SAVING_SUBCLASS = """import torch.distributed as dist

from base import BaseTrainer


class Trainer(BaseTrainer):
    def run(self, loader, epochs):
        for epoch in range(epochs):
            for x, y in loader:
                self.step(x, y)
            if dist.get_rank() == 0:
                self.save_checkpoint(epoch)
            score = self.evaluate()
            if score > self.best:
                self.best = score
                self.save_best_checkpoint()
"""


def test_an_inherited_save_helper_called_on_every_rank_is_found_at_the_call(tmp_path, monkeypatch):
    # scrl (issue #5): the periodic save is guarded, the best-checkpoint save from the base class is not
    files = {"base.py": SAVING_BASE, "trainer.py": SAVING_SUBCLASS}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD303"] == [("trainer.py", 16, "TD303")]


def test_an_inherited_save_helper_under_the_rank_test_is_quiet(tmp_path, monkeypatch):
    fixed = SAVING_SUBCLASS.replace("                self.save_best_checkpoint()",
                                "                if dist.get_rank() == 0:\n                    self.save_best_checkpoint()")
    files = {"base.py": SAVING_BASE, "trainer.py": fixed}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD303"] == []


BUNCH = """import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


class Bunch:
    def __init__(self, trainset, batch_size=64, shuffle=True):
        train_sampler = DistributedSampler(trainset, shuffle=shuffle)
        self.train_loader = DataLoader(trainset, batch_size=batch_size, sampler=train_sampler)
"""
EPOCHS = """import torch


class Trainer:
    def __init__(self, data, model, optimizer):
        self.data, self.model, self.optimizer = data, model, optimizer

    def run(self, epochs):
        for epoch in range(epochs):
            for x, y in self.data.train_loader:
                self.optimizer.zero_grad()
                torch.nn.functional.cross_entropy(self.model(x), y).backward()
                self.optimizer.step()
"""


def test_a_sampler_built_in_a_data_module_and_an_epoch_loop_in_another_file_without_set_epoch(tmp_path, monkeypatch):
    # asv-subtools (issue #8): egs.py's BaseBunch builds the loader on a DistributedSampler, trainer.py loops epochs
    # over data.train_loader, and nothing in the project calls set_epoch
    files = {"egs.py": BUNCH, "trainer.py": EPOCHS}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD301"] == [("egs.py", 8, "TD301")]


def test_set_epoch_called_in_the_trainer_keeps_the_data_module_quiet(tmp_path, monkeypatch):
    fixed = EPOCHS.replace("        for epoch in range(epochs):\n",
                           "        for epoch in range(epochs):\n            self.data.train_loader.sampler.set_epoch(epoch)\n")
    files = {"egs.py": BUNCH, "trainer.py": fixed}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD301"] == []


EVALUATOR_CLASS = """import torch


class Evaluator:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader

    def get_scores(self):
        self.model.eval()
        total = 0.0
        for x, y in self.loader:
            with torch.no_grad():
                total += torch.nn.functional.cross_entropy(self.model(x), y).item()
        return total / len(self.loader)
"""
TRAINER_CLASS = """import torch

from evaluators.evaluator import Evaluator


class Trainer:
    def __init__(self, model, optimizer, train_loader, dev_loader):
        self.model = model
        self.optimizer = optimizer
        self.train_loader = train_loader
        self.dev_loader = dev_loader

    def train_epoch(self):
        for x, y in self.train_loader:
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()

    def train(self, epochs):
        self.model.train()
        for epoch in range(epochs):
            self.train_epoch()
            dev_evaluator = Evaluator(self.model, self.dev_loader)
            score = dev_evaluator.get_scores()
"""


def test_an_evaluator_object_of_another_file_leaves_the_trainers_model_in_eval_mode(tmp_path, monkeypatch):
    # castorini/hedwig #17: the evaluator is built around self.model each epoch and its method calls .eval()
    found = _findings(tmp_path, monkeypatch, {"evaluators/evaluator.py": EVALUATOR_CLASS, "trainers/trainer.py": TRAINER_CLASS})
    assert [f for f in found if f[2] == "TD602"] == [("trainers/trainer.py", 25, "TD602")]


def test_an_evaluator_object_whose_caller_restores_train_mode_is_quiet(tmp_path, monkeypatch):
    restored = TRAINER_CLASS.replace("            self.train_epoch()\n", "            self.model.train()\n"
                               "            self.train_epoch()\n")
    found = _findings(tmp_path, monkeypatch, {"evaluators/evaluator.py": EVALUATOR_CLASS, "trainers/trainer.py": restored})
    assert [f for f in found if f[2] == "TD602"] == []
    built_only = TRAINER_CLASS.replace("            score = dev_evaluator.get_scores()\n", "")
    found = _findings(tmp_path, monkeypatch, {"evaluators/evaluator.py": EVALUATOR_CLASS, "trainers/trainer.py": built_only})
    assert [f for f in found if f[2] == "TD602"] == []


ESTIMATE = """import torch


@torch.inference_mode()
def estimate_loss(model, loaders, eval_iters):
    out = {}
    for split, loader in loaders:
        losses = torch.empty(eval_iters)
        for i, (x, y) in zip(range(eval_iters), loader):
            losses[i] = model(x, labels=y).loss.item()
        out[split] = losses.mean().item()
    return out
"""
GPT = """import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width, p):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.fc(x))
"""
RUN = """import torch

from metrics import estimate_loss
from model import Block


def train(loader, val_loader, steps):
    model = Block(64, 0.3)
    optimizer = torch.optim.AdamW(model.parameters())
    for step, (x, y) in enumerate(loader):
        if step % 100 == 0:
            losses = estimate_loss(model, [("val", val_loader)], 10)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_an_evaluation_helper_of_another_file_when_no_file_ever_calls_eval(tmp_path, monkeypatch):
    # ipolharvard/ethos-ares #20: dropout 0.3, estimate_loss(model, ...) under inference_mode, no .eval() anywhere
    found = _findings(tmp_path, monkeypatch, {"metrics.py": ESTIMATE, "model.py": GPT, "run.py": RUN})
    assert [f for f in found if f[2] == "TD601"] == [("metrics.py", 10, "TD601")]


def test_an_evaluation_helper_is_quiet_when_the_caller_switches_or_the_model_has_no_dropout(tmp_path, monkeypatch):
    switched = RUN.replace("            losses = estimate_loss(", "            model.eval()\n            losses = estimate_loss(")
    found = _findings(tmp_path, monkeypatch, {"metrics.py": ESTIMATE, "model.py": GPT, "run.py": switched})
    assert [f for f in found if f[2] == "TD601"] == []
    plain = GPT.replace("        self.drop = nn.Dropout(p)\n", "").replace("self.drop(self.fc(x))", "self.fc(x)")
    found = _findings(tmp_path, monkeypatch, {"metrics.py": ESTIMATE, "model.py": plain, "run.py": RUN})
    assert [f for f in found if f[2] == "TD601"] == []


ALGORITHM = """import torch


class DLA:
    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def separate_gradient_update(self):
        self.optimizer.zero_grad()
        self.loss.backward()
        self.optimizer.step()

    def train(self, batch):
        x, y = batch
        self.loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.separate_gradient_update()
        return self.loss, None, {"loss": 0.0}
"""
LOOP = """from ultra.dla import DLA


def main(model, batches, steps_per_checkpoint):
    algorithm = DLA(model, 0.1)
    loss = 0.0
    previous_losses = []
    for step, batch in enumerate(batches):
        step_loss, _, summary = algorithm.train(batch)
        loss += step_loss / steps_per_checkpoint
        if step % steps_per_checkpoint == 0:
            previous_losses.append(loss)
            loss = 0.0
"""


def test_a_running_total_of_what_another_files_train_method_returns_with_its_graph(tmp_path, monkeypatch):
    # ULTR-Community/ULTRA_pytorch #6: DLA.train() returns self.loss, which another method backpropagates
    found = _findings(tmp_path, monkeypatch, {"ultra/dla.py": ALGORITHM, "main.py": LOOP})
    assert [f for f in found if f[2] == "TD101"] == [("main.py", 10, "TD101")]


def test_a_running_total_of_the_returned_value_or_of_another_position_is_quiet(tmp_path, monkeypatch):
    fixed = ALGORITHM.replace("return self.loss, None,", "return self.loss.item(), None,")
    found = _findings(tmp_path, monkeypatch, {"ultra/dla.py": fixed, "main.py": LOOP})
    assert [f for f in found if f[2] == "TD101"] == []
    other = LOOP.replace("step_loss, _, summary =", "_, step_loss, summary =")
    found = _findings(tmp_path, monkeypatch, {"ultra/dla.py": ALGORITHM, "main.py": other})
    assert [f for f in found if f[2] == "TD101"] == []


MULTI_TASK = """import random

import torch
from itertools import cycle
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler


def main(args, model, optimizer, datasets):
    loaders = {}
    for task, data in datasets.items():
        if args.local_rank == -1:
            train_sampler = RandomSampler(data)
        else:
            train_sampler = DistributedSampler(data)
        train_dataloader = DataLoader(data, sampler=train_sampler, batch_size=32)
        loaders[task] = cycle(train_dataloader)
    for step in range(args.max_steps):
        train_dataloader = loaders[random.choice(list(loaders))]
        x, y = next(train_dataloader)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
"""
SINGLE_TASK = """import torch
from torch.utils.data import DataLoader, RandomSampler


def main(args, model, optimizer, data):
    train_dataloader = DataLoader(data, sampler=RandomSampler(data), batch_size=32)
    for epoch in range(args.epochs):
        for x, y in train_dataloader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
"""


def test_a_loader_its_function_keeps_is_not_another_script_s_epoch_loop(tmp_path, monkeypatch):
    # CodeT5 (run_multi_gen.py, run_clone.py): two scripts that each call their own loader `train_dataloader`;
    # the multi-task one keeps its loaders in main() and draws from them with next(), it has no epoch loop
    files = {"run_multi_gen.py": MULTI_TASK, "run_clone.py": SINGLE_TASK}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD301"] == []


def test_a_local_loader_handed_to_another_file_s_epoch_loop_is_still_joined(tmp_path, monkeypatch):
    main = ("from torch.utils.data import DataLoader\nfrom torch.utils.data.distributed import DistributedSampler\n"
            "from trainer import Trainer\n\n\ndef main(trainset, model, optimizer):\n"
            "    train_sampler = DistributedSampler(trainset)\n"
            "    train_loader = DataLoader(trainset, batch_size=64, sampler=train_sampler)\n"
            "    Trainer(train_loader, model, optimizer).run(10)\n")
    trainer = EPOCHS.replace("data, model, optimizer", "train_loader, model, optimizer").replace(
        "self.data, self.model", "self.train_loader, self.model").replace("self.data.train_loader", "self.train_loader")
    found = [f for f in _findings(tmp_path, monkeypatch, {"main.py": main, "trainer.py": trainer}) if f[2] == "TD301"]
    assert found == [("main.py", 7, "TD301")]


EMA_UTILS = """from copy import deepcopy

import torch


class ModelEma:
    def __init__(self, model, decay=0.9999, resume=""):
        self.ema = deepcopy(model)
        self.decay = decay
        if resume:
            self._load_checkpoint(resume)

    def _load_checkpoint(self, checkpoint_path):
        checkpoint = torch.load(checkpoint_path)
        self.ema.load_state_dict(checkpoint["state_dict_ema"])
"""
EMA_TRAIN = """import os

import torch

from utils import ModelEma


def main(args, model):
    torch.distributed.init_process_group(backend="nccl", init_method="env://")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = torch.nn.parallel.DistributedDataParallel(model.cuda())
    model_ema = ModelEma(model, decay=args.model_ema_decay, resume=args.resume)
    return model_ema
"""


def test_a_library_loader_built_by_a_distributed_script_is_found(tmp_path, monkeypatch):
    # timm #72: train.py builds ModelEma(..., resume=...) in every DDP process; utils.py loads with no map_location
    files = {"utils.py": EMA_UTILS, "train.py": EMA_TRAIN}
    assert ("utils.py", 14, "TD703") in _findings(tmp_path, monkeypatch, files)


def test_a_library_loader_built_by_a_single_process_script_is_quiet(tmp_path, monkeypatch):
    single = EMA_TRAIN.replace('    torch.distributed.init_process_group(backend="nccl", init_method="env://")\n', "")
    single = single.replace("torch.nn.parallel.DistributedDataParallel(model.cuda())", "model.cuda()")
    files = {"utils.py": EMA_UTILS, "train.py": single}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD703"] == []


LOG_SOFTMAX_MODEL = """import torch.nn.functional as F
from torch import nn


class SetNet(nn.Module):
    def __init__(self, d, n_classes):
        super().__init__()
        self.fc = nn.Linear(d, n_classes)

    def forward(self, x):
        return F.log_softmax(self.fc(x), dim=1)
"""
CLOSURE_TRAIN = """import torch
import torch.nn.functional as F

from models import SetNet

model = SetNet(8, 3)
optimizer = torch.optim.Adam(model.parameters())


def train(X, y):
    optimizer.zero_grad()
    output = model(X)
    loss = F.cross_entropy(output, y)
    loss.backward()
    optimizer.step()
    return loss


for _ in range(3):
    train(torch.randn(4, 8), torch.randint(0, 3, (4,)))
"""


def test_log_softmax_model_read_by_a_closure_into_cross_entropy_is_found_at_the_model(tmp_path, monkeypatch):
    # giannisnik/repset: models.py ends in log_softmax, main.py's train() reads the global model
    files = {"models.py": LOG_SOFTMAX_MODEL, "main.py": CLOSURE_TRAIN}
    assert ("models.py", 11, "TD210") in _findings(tmp_path, monkeypatch, files)


def test_log_softmax_model_into_nll_loss_is_not_found(tmp_path, monkeypatch):
    files = {"models.py": LOG_SOFTMAX_MODEL, "main.py": CLOSURE_TRAIN.replace("F.cross_entropy", "F.nll_loss")}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] in ("TD205", "TD210")] == []


TUPLE_MODEL = """import torch.nn.functional as F
from torch import nn


class TextCNN(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.fc = nn.Linear(vocab, 4)

    def forward(self, x):
        probs = F.softmax(self.fc(x), dim=1)
        classes = probs.argmax(1)
        return probs, classes
"""
TUPLE_TRAIN = """import torch
from torch import nn

from model import TextCNN

model = TextCNN(16)
loss_function = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters())
for _ in range(3):
    probs, classes = model(torch.randn(4, 16))
    loss = loss_function(probs, torch.randint(0, 4, (4,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_softmax_element_of_a_tuple_from_another_file_is_found_at_the_softmax(tmp_path, monkeypatch):
    # yongjincho/cnn-text-classification-pytorch: forward returns (softmax, argmax); the train script unpacks it
    files = {"model.py": TUPLE_MODEL, "text_classifier.py": TUPLE_TRAIN}
    assert ("model.py", 11, "TD205") in _findings(tmp_path, monkeypatch, files)


def test_the_other_element_of_the_tuple_is_not_found(tmp_path, monkeypatch):
    train = TUPLE_TRAIN.replace("probs, classes = model", "classes, probs = model")
    files = {"model.py": TUPLE_MODEL, "text_classifier.py": train}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD205"] == []


CAPSULE = """import torch.nn.functional as F
from torch import nn


class CapsuleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        classes = F.softmax(self.fc(x), dim=-1)
        return classes, classes.detach().mean(1)


class CapsuleLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.cross_entropy_loss = nn.CrossEntropyLoss()

    def forward(self, classes, labels):
        return self.cross_entropy_loss(classes[:, 0, :], labels)
"""
CAPSULE_TRAIN = """import torch

import model_big

capnet = model_big.CapsuleNet()
capsule_loss = model_big.CapsuleLoss()
optimizer = torch.optim.Adam(capnet.parameters())
for _ in range(3):
    classes, class_ = capnet(torch.randn(4, 3, 8))
    loss_dis = capsule_loss(classes, torch.randint(0, 2, (4,)))
    optimizer.zero_grad()
    loss_dis.backward()
    optimizer.step()
"""


def test_softmax_model_into_a_loss_class_of_another_file_is_found_at_the_softmax(tmp_path, monkeypatch):
    # Capsule-Forensics-v2: CapsuleLoss's forward applies CrossEntropyLoss to what it is handed
    files = {"model_big.py": CAPSULE, "train_binary.py": CAPSULE_TRAIN}
    assert ("model_big.py", 11, "TD205") in _findings(tmp_path, monkeypatch, files)


def test_a_loss_class_that_is_not_cross_entropy_is_not_found(tmp_path, monkeypatch):
    capsule = CAPSULE.replace("nn.CrossEntropyLoss()", "nn.MSELoss()")
    files = {"model_big.py": capsule, "train_binary.py": CAPSULE_TRAIN}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD205"] == []


CRITERION_RUN = """def train(model, loader, optimizer, criterion):
    model.train()
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = criterion(output, target)
        loss.backward()
        optimizer.step()
"""
CRITERION_MAIN = """import torch

from models import SetNet
from run import train

model = SetNet(8, 3)
if torch.cuda.device_count() > 1:
    model = torch.nn.DataParallel(model)
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(4, 8), torch.randint(0, 3, (4,)))]
train(model, loader, optimizer, criterion)
"""


def test_log_softmax_model_handed_with_a_cross_entropy_criterion_is_found_at_the_model(tmp_path, monkeypatch):
    # Randl/MobileNetV2-pytorch: imagenet.py hands the model and CrossEntropyLoss to run.train(model, ..., criterion)
    files = {"models.py": LOG_SOFTMAX_MODEL, "run.py": CRITERION_RUN, "main.py": CRITERION_MAIN}
    assert ("models.py", 11, "TD210") in _findings(tmp_path, monkeypatch, files)


def test_log_softmax_model_handed_with_an_nll_criterion_is_not_found(tmp_path, monkeypatch):
    main = CRITERION_MAIN.replace("torch.nn.CrossEntropyLoss()", "torch.nn.NLLLoss()")
    files = {"models.py": LOG_SOFTMAX_MODEL, "run.py": CRITERION_RUN, "main.py": main}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] in ("TD205", "TD210")] == []


COUNTER = """class MetricCounter:
    def __init__(self, name):
        self.name = name
        self.G_loss = []
        self.D_loss = []

    def clear(self):
        self.G_loss, self.D_loss = [], []

    def add_losses(self, l_G, l_D):
        self.G_loss.append(l_G)
        self.D_loss.append(l_D)
"""

GAN_TRAINER = """import torch

from metric_counter import MetricCounter


class Trainer:
    def __init__(self, netG, netD, loader):
        self.netG, self.netD, self.loader = netG, netD, loader
        self.optimizer_G = torch.optim.Adam(netG.parameters())
        self.optimizer_D = torch.optim.Adam(netD.parameters())
        self.metric_counter = MetricCounter("gan")

    def _update_d(self, outputs):
        self.optimizer_D.zero_grad()
        loss_D = self.netD(outputs.detach()).mean()
        loss_D.backward(retain_graph=True)
        self.optimizer_D.step()
        return loss_D

    def run_epoch(self):
        self.metric_counter.clear()
        for inputs in self.loader:
            outputs = self.netG(inputs)
            loss_D = self._update_d(outputs)
            self.optimizer_G.zero_grad()
            loss_G = -self.netD(outputs).mean()
            loss_G.backward()
            self.optimizer_G.step()
            self.metric_counter.add_losses(loss_G.item(), loss_D)
"""


@pytest.mark.parametrize("order", [["train.py", "metric_counter.py"], ["metric_counter.py", "train.py"]])
def test_a_graph_handed_to_a_helper_class_of_another_file_that_keeps_it(tmp_path, monkeypatch, order):
    # VITA-Group/DeblurGANv2 395ba5a: `_update_d` returns the backpropagated loss_D, MetricCounter appends it
    found = _findings(tmp_path, monkeypatch, {"metric_counter.py": COUNTER, "train.py": GAN_TRAINER}, order)
    assert [f for f in found if f[2] == "TD101"] == [("train.py", 29, "TD101")]


def test_a_number_handed_to_that_helper_or_a_helper_that_keeps_nothing_is_quiet(tmp_path, monkeypatch):
    fixed = GAN_TRAINER.replace("        return loss_D\n", "        return loss_D.item()\n")
    found = _findings(tmp_path, monkeypatch, {"metric_counter.py": COUNTER, "train.py": fixed})
    assert [f for f in found if f[2] == "TD101"] == []
    forgetful = COUNTER.replace("        self.D_loss.append(l_D)\n", "        self.last_D = l_D\n")
    found = _findings(tmp_path, monkeypatch, {"metric_counter.py": forgetful, "train.py": GAN_TRAINER})
    assert [f for f in found if f[2] == "TD101"] == []


TRACKERS = """class LossesTrackEpoch:
    def __init__(self, n):
        self.n = n
        self.train_losses = {}

    def update_train_losses(self, loss):
        for key in loss:
            self.train_losses[key] += loss[key]


class Metrics:
    def __init__(self, n):
        self.losses_track = LossesTrackEpoch(n)
"""

TRACKED_LOOP = """import torch

from common.metrics import Metrics


def train(model, optimizer, loader, epochs):
    metrics = Metrics(len(loader))
    for epoch in range(epochs):
        for data in loader:
            loss = model.compute_loss(model(data), data)
            optimizer.zero_grad()
            loss["total"].backward()
            optimizer.step()
            metrics.losses_track.update_train_losses(loss)
"""


@pytest.mark.parametrize("order", [["train.py", "common"], ["common", "train.py"]])
def test_a_graph_handed_to_a_helper_held_by_another_helper_of_another_file(tmp_path, monkeypatch, order):
    # jokester-zzz/SSA-SC #2: Metrics keeps a LossesTrackEpoch whose update adds every loss tensor into a dict
    files = {"common/__init__.py": "", "common/metrics.py": TRACKERS, "train.py": TRACKED_LOOP}
    found = _findings(tmp_path, monkeypatch, files, order)
    assert [f for f in found if f[2] == "TD101"] == [("train.py", 14, "TD101")]


def test_numbers_handed_to_the_nested_helper_are_quiet(tmp_path, monkeypatch):
    fixed = TRACKED_LOOP.replace("update_train_losses(loss)", "update_train_losses({k: v.item() for k, v in loss.items()})")
    files = {"common/__init__.py": "", "common/metrics.py": TRACKERS, "train.py": fixed}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD101"] == []


# -- what callers in other files hand to a function's parameters (semantic/projectcalls.py) ---------------------------

HANDED_ENGINE = """import torch


def evaluate(net, data):
    total = 0.0
    for x, y in data:
        total += torch.nn.functional.cross_entropy(net(x), y).item()
    return total / len(data)
"""
HANDED_MODELS = """import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.fc(self.drop(x))
"""
HANDED_TRAIN = """import torch
from torch.utils.data import DataLoader

from engine import evaluate
from models import Net


def main():
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(range(8), batch_size=2)
    val_loader = DataLoader(range(8), batch_size=2)
    for epoch in range(3):
        for x, y in train_loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        evaluate(model, val_loader)
"""


@pytest.mark.parametrize("order", [["train.py", "engine.py", "models.py"], ["models.py", "engine.py", "train.py"]])
def test_a_model_and_loader_handed_in_from_another_file_make_an_evaluation_loop(tmp_path, monkeypatch, order):
    # `def evaluate(net, data)` names neither a model nor a loader: the caller in train.py hands in a Net with
    # dropout and a DataLoader, so the loop is an evaluation with autograd on, in train mode
    files = {"engine.py": HANDED_ENGINE, "models.py": HANDED_MODELS, "train.py": HANDED_TRAIN}
    assert sorted(_findings(tmp_path, monkeypatch, files, order)) == [("engine.py", 7, "TD102"), ("engine.py", 7, "TD601")]


def test_an_evaluation_in_eval_mode_under_no_grad_with_handed_objects_is_quiet(tmp_path, monkeypatch):
    engine = HANDED_ENGINE.replace("    total = 0.0\n", "    net.eval()\n    total = 0.0\n").replace(
        "def evaluate(", "@torch.no_grad()\ndef evaluate(").replace("    return total", "    net.train()\n    return total")
    files = {"engine.py": engine, "models.py": HANDED_MODELS, "train.py": HANDED_TRAIN}
    assert _findings(tmp_path, monkeypatch, files) == []


def test_callers_that_hand_in_different_kinds_give_the_parameter_none(tmp_path, monkeypatch):
    # another caller hands `evaluate` an optimizer where train.py hands a loader: what `data` holds is unknown, as it
    # was before the pre-pass, so nothing says the loop walks evaluation data
    other = ("import torch\nfrom engine import evaluate\nfrom models import Net\n\n\ndef probe():\n"
             "    model = Net()\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    evaluate(model, opt)\n")
    files = {"engine.py": HANDED_ENGINE, "models.py": HANDED_MODELS, "train.py": HANDED_TRAIN, "probe.py": other}
    assert _findings(tmp_path, monkeypatch, files) == []


HANDED_SOLVER = """import torch


class Solver:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def save(self, path):
        package = {"state": self.model.state_dict(), "class": type(self.model).__name__}
        model = package
        torch.save(model, path)
"""
HANDED_SOLVER_MAIN = """import torch

from models import Net
from solver import Solver

model = Net()
Solver(model, torch.optim.SGD(model.parameters(), lr=0.1)).save("last.pt")
"""


def test_a_handed_kind_stays_with_its_parameter_when_a_sibling_method_reuses_the_name(tmp_path, monkeypatch):
    # `model` is handed to Solver.__init__ from main.py, but save() binds its own `model` to a dict: names are
    # file-wide in the index, so the handed kind would call that dict a pickled module object (TD704)
    files = {"models.py": HANDED_MODELS, "solver.py": HANDED_SOLVER, "main.py": HANDED_SOLVER_MAIN}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[0] == "solver.py"] == []


# -- one read per file: the pre-pass's bytes handed to the analysis (check.project_classes) ----------------------------


def test_the_pre_pass_keeps_each_files_bytes_and_the_analysis_from_them_is_the_same(tmp_path, monkeypatch):
    from torchdoctor.check import project_classes
    from torchdoctor.rules.static import registry
    from torchdoctor.rules.static.engine import Options, analyse_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "engine.py").write_text(HANDED_ENGINE)
    (tmp_path / "models.py").write_text(HANDED_MODELS)
    (tmp_path / "notes.txt").write_text("not python")
    items = [(p, p) for p in ("engine.py", "models.py", "notes.txt")]
    sources: dict[str, bytes] = {}
    table = project_classes(items, [str(tmp_path)], 1 << 20, sources)
    assert table is not None and table.is_module_class("models.Net")
    assert sources == {"engine.py": HANDED_ENGINE.encode(), "models.py": HANDED_MODELS.encode()}
    options = Options(codes=tuple(registry.rules()), project=table)

    def shown(result):
        return [(r.finding.code, r.finding.line, r.finding.message) for r in result.results], result.facts

    for path in ("engine.py", "models.py"):
        assert shown(analyse_file(path, path, options, sources[path])) == shown(analyse_file(path, path, options))


def test_the_pre_pass_reads_text_as_a_file_opened_in_text_mode(tmp_path):
    from torchdoctor.check import _text

    # Windows and old-Mac line endings, a byte that is not UTF-8, a BOM: the pre-pass's patterns see what
    # `open(path, encoding="utf-8", errors="replace")` reads
    data = b"\xef\xbb\xbfimport torch\r\nfrom models import Net\rx = '\xff'\r\n\r\ndef f():\n    return Net()\r"
    (tmp_path / "a.py").write_bytes(data)
    with open(tmp_path / "a.py", encoding="utf-8", errors="replace") as fh:
        assert _text(data) == fh.read()
    assert _text(b"plain\ntext\n") == "plain\ntext\n"


def test_the_line_searches_find_what_the_patterns_find_over_the_whole_text():
    from torchdoctor.rules.static.semantic import projectcalls

    text = ("import os; import sys\nfrom a import (b,\n    important as c)\nfrom .d import e  # import f\n"
            "x = 'import y'\n  import z\ndef g():\n    if x:\n        return Net(), y\n    return  w\n"
            "    value = returned\n\treturn(v)\nclass H:\n    def i(self):\n        return self.j  # return\n")
    lines = "\n" + text
    expect = [(m.span(), m.groups()) for m in projectcalls._IMPORTS.finditer(lines)]
    assert [(m.span(), m.groups()) for m in projectcalls._lines_with(lines, "import", projectcalls._IMPORTS)] == expect
    assert len(expect) == 4  # `import os` (not `; import sys`), the parenthesised one, `.d`, the indented `z`
    for start, stop in ((0, len(text)), (text.index("def g"), text.index("class H")), (5, 40)):
        expect = [(m.span(), m.groups()) for m in projectcalls._RETURN.finditer(text, start, stop)]
        found = projectcalls._lines_with(text, "return", projectcalls._RETURN, start, stop)
        assert [(m.span(), m.groups()) for m in found] == expect
    assert len(list(projectcalls._RETURN.finditer(text))) == 3


# -- TD301: samplers and loaders from another file's factory -------------------------------------------------------

SAMPLER_FACTORY = """from torch.utils.data.distributed import DistributedSampler


def build_sampler(dataset, world_size, rank):
    return DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
"""
SAMPLER_CALLER = """import torch
from torch.utils.data import DataLoader

from data import build_sampler


def main(model, optimizer, dataset, world_size, rank, epochs):
    sampler = build_sampler(dataset, world_size, rank)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
"""


def test_a_distributed_sampler_returned_by_another_file_s_factory_needs_set_epoch(tmp_path, monkeypatch):
    files = {"data.py": SAMPLER_FACTORY, "train.py": SAMPLER_CALLER}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD301"] == [("train.py", 8, "TD301")]


def test_a_factory_sampler_whose_epoch_is_set_is_quiet(tmp_path, monkeypatch):
    fixed = SAMPLER_CALLER.replace("    for epoch in range(epochs):\n",
                                   "    for epoch in range(epochs):\n        sampler.set_epoch(epoch)\n")
    assert [f for f in _findings(tmp_path, monkeypatch, {"data.py": SAMPLER_FACTORY, "train.py": fixed})
            if f[2] == "TD301"] == []


def test_a_factory_sampler_in_a_fixed_order_is_quiet(tmp_path, monkeypatch):
    # told so in the factory (`DistributedSampler(..., shuffle=False)`) or at the call (`shuffle=False`)
    fixed_there = SAMPLER_FACTORY.replace("shuffle=True", "shuffle=False")
    assert [f for f in _findings(tmp_path, monkeypatch, {"data.py": fixed_there, "train.py": SAMPLER_CALLER})
            if f[2] == "TD301"] == []
    asked = SAMPLER_FACTORY.replace("world_size, rank):", "world_size, rank, shuffle=True):").replace(
        "shuffle=True)", "shuffle=shuffle)")
    caller = SAMPLER_CALLER.replace("build_sampler(dataset, world_size, rank)",
                                    "build_sampler(dataset, world_size, rank, shuffle=False)")
    assert [f for f in _findings(tmp_path, monkeypatch, {"data.py": asked, "train.py": caller})
            if f[2] == "TD301"] == []


# HydraGNN (PR #98): create_dataloaders() in one module builds the loaders on DistributedSamplers and returns them;
# another module's epoch loop receives them under other names, and nothing calls set_epoch
LOADER_FACTORY = """import torch
import torch.distributed as dist

try:
    from torch_geometric.loader import DataLoader
except ImportError:
    from torch_geometric.data import DataLoader


def create_dataloaders(trainset, valset, batch_size):
    if dist.is_initialized():
        train_sampler = torch.utils.data.distributed.DistributedSampler(trainset)
        val_sampler = torch.utils.data.distributed.DistributedSampler(valset)
        train_loader = DataLoader(trainset, batch_size=batch_size, shuffle=False, sampler=train_sampler)
        val_loader = DataLoader(valset, batch_size=batch_size, shuffle=False, sampler=val_sampler)
    else:
        train_loader = DataLoader(trainset, batch_size=batch_size, shuffle=True)
        val_loader = DataLoader(valset, batch_size=batch_size, shuffle=True)
    return train_loader, val_loader
"""
LOADER_LOOP = """import torch

from pkg.load_data import create_dataloaders


def fit(model, optimizer, trainset, valset, num_epoch):
    loader, held_out = create_dataloaders(trainset, valset, 64)
    for epoch in range(num_epoch):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
"""


def test_a_loader_from_another_file_s_factory_is_joined_to_its_epoch_loop_by_the_factory(tmp_path, monkeypatch):
    files = {"pkg/load_data.py": LOADER_FACTORY, "pkg/fit.py": LOADER_LOOP}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD301"] == [("pkg/load_data.py", 12, "TD301")]


def test_a_factory_loader_whose_sampler_epoch_is_set_is_quiet(tmp_path, monkeypatch):
    fixed = LOADER_LOOP.replace("    for epoch in range(num_epoch):\n",
                                "    for epoch in range(num_epoch):\n        loader.sampler.set_epoch(epoch)\n")
    files = {"pkg/load_data.py": LOADER_FACTORY, "pkg/fit.py": fixed}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD301"] == []


def test_a_factory_loader_used_in_the_second_place_only_is_not_the_shuffled_one(tmp_path, monkeypatch):
    # the epoch loop iterates what the factory returns second (the validation loader): the join keeps the place
    loop = LOADER_LOOP.replace("loader, held_out = ", "held_out, loader = ")
    factory = LOADER_FACTORY.replace("val_sampler = torch.utils.data.distributed.DistributedSampler(valset)",
                                     "val_sampler = None")
    files = {"pkg/load_data.py": factory, "pkg/fit.py": loop}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD301"] == []


LOADER_AND_SAMPLER_FACTORY = """from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def get_loaders(dataset, batch_size):
    sampler = DistributedSampler(dataset)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler
"""
LOADER_AND_SAMPLER_LOOP = """import torch

from data import get_loaders


def main(model, optimizer, dataset, epochs):
    loader, sampler = get_loaders(dataset, 32)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
"""


def test_a_factory_returning_a_loader_and_its_sampler_needs_set_epoch_on_that_sampler(tmp_path, monkeypatch):
    files = {"data.py": LOADER_AND_SAMPLER_FACTORY, "train.py": LOADER_AND_SAMPLER_LOOP}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD301"] == [("train.py", 7, "TD301")]
    fixed = LOADER_AND_SAMPLER_LOOP.replace("    for epoch in range(epochs):\n",
                                            "    for epoch in range(epochs):\n        sampler.set_epoch(epoch)\n")
    files = {"data.py": LOADER_AND_SAMPLER_FACTORY, "train.py": fixed}
    assert [f for f in _findings(tmp_path, monkeypatch, files) if f[2] == "TD301"] == []

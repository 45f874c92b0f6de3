# Source: https://github.com/metatensor/metatrain/issues/203 (fixed by PR #262, commit 7943c9c)
# Original: metatensor/metatrain src/metatrain/cli/train.py (train: --continue), experimental/soap_bpnn/model.py
# (SoapBpnn.save_checkpoint, load_checkpoint, restart) and experimental/soap_bpnn/trainer.py (Trainer.train), at
# 7943c9c^
# Bug: checkpoints hold the model's hypers and state_dict only; `--continue` rebuilds the model from one and the trainer
# then creates a fresh Adam (and ReduceLROnPlateau) for it: the moment estimates restart from zero at every
# continuation ("Not saving the optimizer state leads to some big jumps when using Adam", the issue).
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class SoapBpnn(nn.Module):
    """Per-atom MLP on fixed descriptors, summed to a structure energy (a stand-in for SOAP + BPNN)."""

    def __init__(self, model_hypers, dataset_info):
        super().__init__()
        self.hypers, self.dataset_info = model_hypers, dataset_info
        width = model_hypers["num_neurons_per_layer"]
        self.bpnn = nn.Sequential(nn.Linear(model_hypers["n_descriptors"], width), nn.SiLU(), nn.Linear(width, width),
                                  nn.SiLU(), nn.Linear(width, 1))

    def forward(self, descriptors):
        return self.bpnn(descriptors).sum(dim=1).squeeze(-1)

    def restart(self, dataset_info):
        self.dataset_info = {**self.dataset_info, **dataset_info}
        return self

    def save_checkpoint(self, path):
        torch.save({"model_hypers": {"model_hypers": self.hypers, "dataset_info": self.dataset_info},
                    "model_state_dict": self.state_dict()}, path)

    @classmethod
    def load_checkpoint(cls, path):
        model_dict = torch.load(path)
        model = cls(**model_dict["model_hypers"])
        model.load_state_dict(model_dict["model_state_dict"])
        return model


class Trainer:
    def __init__(self, train_hypers):
        self.hypers = train_hypers

    def train(self, model, train_dataloader, val_dataloader, checkpoint_dir):
        loss_fn = nn.MSELoss()
        optimizer = torch.optim.Adam(model.parameters(), lr=self.hypers["learning_rate"])
        lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=self.hypers["scheduler_factor"], patience=self.hypers["scheduler_patience"])
        for epoch in range(self.hypers["num_epochs"]):
            train_loss = 0.0
            for descriptors, energies in train_dataloader:
                optimizer.zero_grad()
                loss = loss_fn(model(descriptors), energies)
                loss.backward()
                optimizer.step()
                train_loss += loss.item()
            with torch.no_grad():
                val_loss = sum(loss_fn(model(d), e).item() for d, e in val_dataloader)
            lr_scheduler.step(val_loss)
            print(f"Epoch {epoch}: train loss {train_loss / len(train_dataloader):.5f} val loss {val_loss:.5f}")
            if epoch % self.hypers["checkpoint_interval"] == 0 or epoch == self.hypers["num_epochs"] - 1:
                model.save_checkpoint(Path(checkpoint_dir) / f"model_{epoch}.ckpt")


def make_dataset(n, seed):
    """Structures of 8 atoms with 12 descriptors each; the energy is a sum of smooth per-atom terms."""
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(n, 8, 12, generator=g)
    e = (torch.tanh(d[..., :4]).sum(-1) + 0.3 * d[..., 4] * d[..., 5]).sum(-1)
    return TensorDataset(d, e)


def train(options, checkpoint_dir, continue_from=None):
    dataset_info = {"targets": ["energy"], "atomic_types": [1, 6, 8]}
    if continue_from is not None:
        print(f"Loading checkpoint from `{continue_from}`")
        model = SoapBpnn.load_checkpoint(continue_from)  # BUG
        model = model.restart(dataset_info)
    else:
        model = SoapBpnn(options["model"], dataset_info)
    trainer = Trainer(options["training"])
    trainer.train(model=model, train_dataloader=DataLoader(make_dataset(512, 0), batch_size=16, shuffle=True),
                  val_dataloader=DataLoader(make_dataset(128, 1), batch_size=64), checkpoint_dir=checkpoint_dir)


options = {"model": {"num_neurons_per_layer": 32, "n_descriptors": 12},
           "training": {"learning_rate": 3e-3, "num_epochs": 4, "scheduler_factor": 0.8, "scheduler_patience": 10,
                        "checkpoint_interval": 2}}
with tempfile.TemporaryDirectory() as checkpoint_dir:
    train(options, checkpoint_dir)  # mtt train options.yaml
    train(options, checkpoint_dir, continue_from=Path(checkpoint_dir) / "model_3.ckpt")  # mtt train --continue

# Source: https://github.com/OpenSportsLab/opensportslib/pull/65
# Original: OpenSportsLab/opensportslib opensportslib/core/trainer/classification_trainer.py
# (Trainer_Classification.train, load; Trainer._save_checkpoint, train) and opensportslib/core/utils/checkpoint.py
# (load_checkpoint), read at c5286dd
# Bug: resuming is load() then train(). load() restores the weights and the epoch counter (no optimizer exists yet,
# so the checkpoint's optimizer and scheduler states are skipped), and train() always builds a fresh optimizer and
# scheduler: Adam's moments and the LR schedule restart although every checkpoint holds them.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(40, 128), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(128, 6))


def build_optimizer(params, cfg):
    return torch.optim.Adam(params, lr=cfg["lr"], betas=(0.9, 0.999), weight_decay=cfg["weight_decay"])


def build_scheduler(optimizer, cfg):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=cfg["step_size"], gamma=cfg["gamma"])


def load_checkpoint(model, path, optimizer=None, scheduler=None):
    checkpoint = torch.load(path, weights_only=False)
    model.load_state_dict(checkpoint["state_dict"])
    if optimizer is not None and "optimizer" in checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if scheduler is not None and "scheduler" in checkpoint:
        scheduler.load_state_dict(checkpoint["scheduler"])
    return model, optimizer, scheduler, checkpoint.get("epoch", 0), checkpoint


class Trainer:
    def __init__(self, train_loader, model, optimizer, scheduler, max_epochs, save_dir):
        self.train_loader, self.model, self.optimizer, self.scheduler = train_loader, model, optimizer, scheduler
        self.max_epochs, self.save_dir = max_epochs, save_dir

    def _run_epoch(self, dataloader):
        self.model.train()
        total = 0.0
        for x, y in dataloader:
            loss = F.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            total += loss.item()
        return total / len(dataloader)

    def _save_checkpoint(self, epoch):
        state = {"epoch": epoch, "state_dict": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict()}
        path = os.path.join(self.save_dir, f"epoch_{epoch}.pt")
        torch.save(state, path)
        return path

    def train(self, epoch_start=0):
        for epoch in range(epoch_start, self.max_epochs):
            loss = self._run_epoch(self.train_loader)
            self.scheduler.step()
            self._save_checkpoint(epoch + 1)
            print("epoch", epoch + 1, "train loss", round(loss, 4), "lr", self.scheduler.get_last_lr()[0])


class Trainer_Classification:
    def __init__(self, config):
        self.config, self.model, self.optimizer, self.scheduler, self.epoch = config, None, None, None, 0

    def train(self, model, train_dataset):
        self.model = model
        optimizer = build_optimizer(self.model.parameters(), cfg=self.config["optimizer"])  # BUG
        scheduler = build_scheduler(optimizer, cfg=self.config["scheduler"])
        self.trainer = Trainer(train_dataset, self.model, optimizer, scheduler, self.config["epochs"],
                               self.config["save_dir"])
        self.trainer.train(epoch_start=self.epoch)

    def load(self, path, optimizer=None, scheduler=None):
        if self.model is None:
            self.model = build_model()
        self.model, optimizer, scheduler, epoch, checkpoint = load_checkpoint(self.model, path, optimizer, scheduler)
        self.optimizer, self.scheduler, self.epoch = optimizer, scheduler, epoch
        return self.model, self.optimizer, self.scheduler, self.epoch


def dataset(n=40):
    w = torch.randn(40, 6)
    out = []
    for _ in range(n):
        x = torch.randn(32, 40)
        out.append((x, (x @ w).argmax(1)))
    return out


config = {"optimizer": {"lr": 1e-3, "weight_decay": 1e-4}, "scheduler": {"step_size": 3, "gamma": 0.3},
          "epochs": 6, "save_dir": None}
torch.manual_seed(1)
data = dataset()
if len(sys.argv) > 1 and sys.argv[1] == "first-job":  # the interrupted run (its own process): 3 of 6 epochs
    config.update(save_dir=sys.argv[2], epochs=3)
    trainer = Trainer_Classification(config)
    trainer.train(build_model(), data)
    sys.exit(0)
save_dir = tempfile.mkdtemp()
subprocess.run([sys.executable, __file__, "first-job", save_dir], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
config.update(save_dir=save_dir)
trainer = Trainer_Classification(config)
model, _, _, epoch = trainer.load(os.path.join(save_dir, "epoch_3.pt"))
print("resuming from epoch", epoch)
trainer.train(model, data)

# Source: https://github.com/LibreYOLO/libreyolo/pull/277 (fix commit 6fc96ed, "fix resume LR inconsistency: defer
#   optimizer state and fast-forward scheduler")
# Original: LibreYOLO/libreyolo libreyolo/training/trainer.py (BaseTrainer.resume / BaseTrainer.setup / BaseTrainer.train)
# Bug: the documented order is trainer.resume(ckpt) then trainer.train(); the optimizer is only created by setup(),
# which train() calls, so when resume() runs self.optimizer is still None and its guard skips the saved optimizer
# state without a word: the weights and the epoch come back, the SGD momentum buffers restart at zero.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

ckpt_dir = tempfile.mkdtemp()

# The interrupted run (its own process, as a resumed job is): 3 epochs of SGD with momentum, then last.pt.
subprocess.run([sys.executable, "-c", (
    "import torch\n"
    "torch.manual_seed(1)\n"
    "m = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))\n"
    "o = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.937, nesterov=True)\n"
    "for _ in range(24):\n"
    "    o.zero_grad(); torch.nn.functional.cross_entropy(m(torch.randn(16, 12)), torch.randint(0, 3, (16,))).backward(); o.step()\n"
    f"torch.save({{'model': m.state_dict(), 'optimizer': o.state_dict(), 'epoch': 2}}, {os.path.join(ckpt_dir, 'last.pt')!r})\n")],
    check=True, env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})


class Config:
    epochs = 8
    lr0 = 0.01
    momentum = 0.937
    batches = 8


class BaseTrainer:
    def __init__(self, model, config):
        self.model = model
        self.config = config
        self.optimizer = None
        self.lr_scheduler = None
        self.start_epoch = 0
        self._is_setup = False
        self.g = torch.Generator().manual_seed(2)

    def _setup_optimizer(self):
        return torch.optim.SGD(self.model.parameters(), lr=self.config.lr0, momentum=self.config.momentum,
                               nesterov=True)

    def setup(self):
        if self._is_setup:
            return
        self.optimizer = self._setup_optimizer()
        self._is_setup = True

    def train_one_epoch(self, epoch):
        self.model.train()
        for _ in range(self.config.batches):
            x, y = torch.randn(16, 12, generator=self.g), torch.randint(0, 3, (16,), generator=self.g)
            loss = F.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    def train(self):
        self.setup()
        for epoch in range(self.start_epoch, self.config.epochs):
            self.train_one_epoch(epoch)
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "epoch": epoch},
                       os.path.join(ckpt_dir, "last.pt"))

    def resume(self, checkpoint_path):
        checkpoint = torch.load(checkpoint_path, map_location="cpu")
        self.model.load_state_dict(checkpoint["model"])
        self.start_epoch = checkpoint["epoch"] + 1
        if self.optimizer is not None and "optimizer" in checkpoint:  # BUG
            self.optimizer.load_state_dict(checkpoint["optimizer"])


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
saved = len(torch.load(os.path.join(ckpt_dir, "last.pt"))["optimizer"]["state"])
first = []
hook = register_optimizer_step_pre_hook(lambda opt, a, k: first.append(len(opt.state)))
trainer = BaseTrainer(model, Config())
trainer.resume(os.path.join(ckpt_dir, "last.pt"))
trainer.train()
hook.remove()
print(f"resumed at epoch {trainer.start_epoch}: checkpoint held momentum for {saved} parameters, "
      f"the optimizer held {first[0]} at its first step")

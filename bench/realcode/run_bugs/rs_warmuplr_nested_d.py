# Source: https://github.com/ildoonet/pytorch-gradual-warmup-lr/issues/27
# Original: ildoonet/pytorch-gradual-warmup-lr warmup_scheduler/scheduler.py (GradualWarmupScheduler, trimmed to the
#   non-plateau path) and the README's usage with a CosineAnnealingLR as after_scheduler
# Bug: GradualWarmupScheduler keeps its after_scheduler object in its own __dict__, so state_dict() pickles it together
# with the optimizer it is bound to, and the inherited load_state_dict puts that unpickled copy back: after the resume
# the cosine schedule steps a copy of the optimizer that nothing trains, and the real optimizer's LR stays where the
# checkpoint left it for the rest of the run ("a static learning rate after resuming").
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import CosineAnnealingLR, LRScheduler

EPOCHS, WARMUP, BATCHES = 14, 3, 6


class GradualWarmupScheduler(LRScheduler):
    """Warm the LR up linearly over total_epoch epochs, then hand over to after_scheduler."""

    def __init__(self, optimizer, multiplier, total_epoch, after_scheduler=None):
        self.multiplier = multiplier
        self.total_epoch = total_epoch
        self.after_scheduler = after_scheduler
        self.finished = False
        super().__init__(optimizer)

    def get_lr(self):
        if self.last_epoch > self.total_epoch:
            if self.after_scheduler:
                if not self.finished:
                    self.after_scheduler.base_lrs = [base_lr * self.multiplier for base_lr in self.base_lrs]
                    self.finished = True
                return self.after_scheduler.get_last_lr()
            return [base_lr * self.multiplier for base_lr in self.base_lrs]
        if self.multiplier == 1.0:
            return [base_lr * (float(self.last_epoch) / self.total_epoch) for base_lr in self.base_lrs]
        return [base_lr * ((self.multiplier - 1.0) * self.last_epoch / self.total_epoch + 1.0)
                for base_lr in self.base_lrs]

    def step(self, epoch=None):
        if self.finished and self.after_scheduler:
            self.after_scheduler.step()
            self._last_lr = self.after_scheduler.get_last_lr()
        else:
            return super().step(epoch)


def build(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cosine = CosineAnnealingLR(optimizer, T_max=EPOCHS - WARMUP)
    return optimizer, GradualWarmupScheduler(optimizer, multiplier=1, total_epoch=WARMUP, after_scheduler=cosine)


def run_epochs(model, optimizer, scheduler, start, stop, g, ckpt):
    lrs = []
    for epoch in range(start, stop):
        lrs.append(optimizer.param_groups[0]["lr"])
        model.train()
        for _ in range(BATCHES):
            x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        scheduler.step()
        torch.save({"epoch": epoch + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict()}, ckpt)
    return lrs


ckpt_dir = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
ckpt_path = os.path.join(ckpt_dir, "ckpt.pth")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 4))
optimizer, scheduler = build(model)
if sys.argv[1:2] == ["--first-run"]:
    # The interrupted run: warm-up and the first epochs of the cosine, then a checkpoint.
    run_epochs(model, optimizer, scheduler, 0, 7, torch.Generator().manual_seed(1), ckpt_path)
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-run", ckpt_dir], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
checkpoint = torch.load(ckpt_path, weights_only=False)  # the scheduler's state holds objects
model.load_state_dict(checkpoint["model"])
optimizer.load_state_dict(checkpoint["optimizer"])
scheduler.load_state_dict(checkpoint["scheduler"])  # BUG
start_epoch = checkpoint["epoch"]
lrs = run_epochs(model, optimizer, scheduler, start_epoch, EPOCHS, torch.Generator().manual_seed(2), ckpt_path)
print("LR per resumed epoch", [f"{v:.4f}" for v in lrs], "scheduler's own LR", f"{scheduler.get_last_lr()[0]:.4f}")

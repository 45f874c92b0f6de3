# Source: https://github.com/facebookresearch/deit/pull/49
# Original: facebookresearch/deit main.py (the per-epoch checkpoint)
# Bug: the checkpoint saves model, optimizer, lr_scheduler, epoch and model_ema but not the loss scaler
# (NativeScaler / GradScaler) state, and resume never restores it.
import os
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.amp.GradScaler("cpu")

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
        self._scaler.scale(loss).backward()
        if clip_grad is not None:
            self._scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()


model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.05)
lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
loss_scaler = NativeScaler()
output_dir = tempfile.mkdtemp()


def train_one_epoch():
    for _ in range(10):
        samples, targets = torch.randn(16, 48), torch.randint(0, 10, (16,))
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(samples).float(), targets)
        optimizer.zero_grad()
        loss_scaler(loss, optimizer, clip_grad=None, parameters=model.parameters())


for epoch in range(4):
    train_one_epoch()
    lr_scheduler.step()
    checkpoint_path = os.path.join(output_dir, "checkpoint.pth")
    torch.save({  # BUG
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "epoch": epoch,
    }, checkpoint_path)
print("done")

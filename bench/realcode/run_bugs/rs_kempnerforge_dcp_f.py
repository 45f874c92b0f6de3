# Source: https://github.com/KempnerInstitute/KempnerForge/pull/115
# Original: KempnerInstitute/KempnerForge kempnerforge/checkpoint/manager.py (CheckpointManager.save / load)
# Bug: the checkpoint manager round-trips the optimizer through the raw optimizer.state_dict(); on resume the
# optimizer is freshly built, its state_dict() has no exp_avg / exp_avg_sq yet (AdamW creates them at the first
# step), so dcp.load has nothing to fill: the weights come back, the saved moments are silently dropped.
import tempfile

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

torch.manual_seed(0)


class CheckpointManager:
    def __init__(self, directory, model, optimizer, scheduler):
        self.directory = directory
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler

    def save(self, step):
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        dcp.save(state, checkpoint_id=f"{self.directory}/step_{step}")
        torch.save({"scheduler": self.scheduler.state_dict(), "step": step}, f"{self.directory}/train_state_{step}.pt")

    def load(self, step):
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        dcp.load(state, checkpoint_id=f"{self.directory}/step_{step}")  # BUG
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        extra = torch.load(f"{self.directory}/train_state_{step}.pt")
        self.scheduler.load_state_dict(extra["scheduler"])
        return extra["step"]


def build():
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=120)
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, start, stop, data):
    for step in range(start, stop):
        x, y = data[step % len(data)]
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    return loss.item()


data = [(torch.randn(16, 32), torch.randn(16, 32)) for _ in range(20)]
with tempfile.TemporaryDirectory() as directory:
    model, optimizer, scheduler = build()
    print("first job", train(model, optimizer, scheduler, 0, 60, data))
    CheckpointManager(directory, model, optimizer, scheduler).save(60)

    model, optimizer, scheduler = build()
    start = CheckpointManager(directory, model, optimizer, scheduler).load(60)
    print("resumed at", start)
    print("second job", train(model, optimizer, scheduler, start, 120, data))

# Source: https://github.com/NKI-AI/direct/pull/218 ("Learning rate scheduler can be checkpointed now": `HasStateDict`
#   left out torch.optim.lr_scheduler._LRScheduler, so the checkpointer neither saved nor loaded the LR scheduler)
# Original: NKI-AI/direct direct/checkpointer.py (Checkpointer.save / Checkpointer.load_from_path) and direct/types.py
#   (HasStateDict = Union[nn.Module, Optimizer, GradScaler]); the engine saves every `checkpointer_period` iterations
# Bug: the checkpointer keeps only the checkpointables that pass an isinstance test on a Union that does not name the
# scheduler: it logs "has no state_dict" and writes the model and the optimizer without it; a resume then warns
# "Requested to load lr_scheduler, but this was not stored" and the warm-up/decay starts again from iteration 0.
import datetime
import logging
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import get_args

import torch
import torch.nn as nn
import torch.nn.functional as F

logger = logging.getLogger("direct")
HasStateDict = nn.Module | torch.optim.Optimizer | torch.amp.GradScaler  # no LR scheduler in it
save_directory = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp())


class Checkpointer:
    def __init__(self, save_directory, **checkpointables):
        self.save_directory = save_directory
        self.model = checkpointables.pop("model")
        self.checkpointables = checkpointables

    def load(self, iteration):
        if iteration == "latest":
            with open(self.save_directory / "last_model.txt") as f:
                iteration = int(f.readline())
        checkpoint = torch.load(self.save_directory / f"model_{iteration}.pt", map_location="cpu")
        self.model.load_state_dict(checkpoint["model"])
        for key in self.checkpointables:
            if key not in checkpoint:
                logger.warning(f"Requested to load {key}, but this was not stored.")
                continue
            self.checkpointables[key].load_state_dict(checkpoint.pop(key))
        checkpoint["iteration"] = iteration
        return checkpoint

    def save(self, iteration, **kwargs):
        data = {"model": self.model.state_dict()}
        for key, obj in self.checkpointables.items():
            if key.endswith("__") and key.startswith("__"):
                data[key] = obj
            elif isinstance(obj, get_args(HasStateDict)):
                data[key] = obj.state_dict()
            else:
                logger.warning(f"Value of key {key} has no state_dict.")
        data.update(kwargs)
        data["__datetime__"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        with open(str(self.save_directory / f"model_{iteration}.pt"), "wb") as f:
            torch.save(data, f)  # BUG
        with open(self.save_directory / "last_model.txt", "w") as f:
            f.write(str(iteration))


def build(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 2, 3, padding=1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: min(1.0, (it + 1) / 20) * 0.98 ** it)
    return model, optimizer, lr_scheduler


def train_iterations(model, optimizer, lr_scheduler, checkpointer, start, stop, period, g, lrs):
    model.train()
    for iteration in range(start, stop):
        x = torch.randn(4, 2, 12, 12, generator=g)
        loss = F.l1_loss(model(x), x.flip(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
        if (iteration + 1) % period == 0:
            checkpointer.save(iteration + 1)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    # the interrupted job: 24 iterations, checkpoints every 8
    m, o, s = build(1)
    train_iterations(m, o, s, Checkpointer(save_directory, model=m, optimizer=o, lr_scheduler=s), 0, 24, 8,
                     torch.Generator().manual_seed(1), [])
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", str(save_directory)], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
logging.basicConfig(level=logging.WARNING)
model, optimizer, lr_scheduler = build(0)
checkpointer = Checkpointer(save_directory, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler)
checkpoint = checkpointer.load("latest")
start = checkpoint["iteration"]
lrs = []
train_iterations(model, optimizer, lr_scheduler, checkpointer, start, start + 24, 8, torch.Generator().manual_seed(2), lrs)
print(f"resumed at iteration {start}: LR {lrs[0]:.2e} at the first resumed step (the first job's LR there was "
      f"{1e-3 * 0.98 ** 23:.2e}); the saved checkpoints hold {sorted(k for k in torch.load(save_directory / 'model_48.pt'))}")

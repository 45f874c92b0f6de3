# Source: https://github.com/amjltc295/pytorch-golden-template/issues/50 ("The LR scheduler is not saved to (or loaded
#   from) checkpoint")
# Original: amjltc295/pytorch-golden-template src/worker/worker_template.py (WorkerTemplate.run -> _update_lr steps
#   the lr_scheduler after each epoch) and the pipeline's _save_checkpoint / _resume_checkpoint of the
#   pytorch-template family it derives from (state = arch, epoch, state_dict, optimizer, monitor_best, config)
# Bug: the training pipeline's checkpoint holds the weights, the optimizer and the epoch but not the LR scheduler the
# training worker steps every epoch; a resume restores the rest and builds the StepLR afresh, so its decay comes as
# many epochs late as the checkpoint had run.
import os
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

save_dir = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()


class WorkerTemplate(ABC):
    def __init__(self, config, model, data_loader, losses, optimizer, lr_scheduler):
        self.config = config
        self.model = model
        self.data_loader = data_loader
        self.losses = losses
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler

    @abstractmethod
    def _run_and_optimize_model(self, data):
        return None, None

    def _iter_data(self, epoch):
        total_loss = 0.0
        for data in self.data_loader:
            _, loss = self._run_and_optimize_model(data)
            total_loss += loss.item()
        return total_loss / len(self.data_loader)

    def _update_lr(self):
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def run(self, epoch):
        self.model.train()
        avg_loss = self._iter_data(epoch)
        self._update_lr()
        return {"epoch": epoch, "loss": avg_loss, "lr": self.optimizer.param_groups[0]["lr"]}


class Trainer(WorkerTemplate):
    def _run_and_optimize_model(self, data):
        self.optimizer.zero_grad()
        output = self.model(data["input"])
        loss = sum(w * fn(output, data["target"]) for fn, w in self.losses.values())
        loss.backward()
        self.optimizer.step()
        return output, loss


class TrainingPipeline:
    def __init__(self, config, resume=None):
        torch.manual_seed(config["seed"])
        self.config = config
        self.model = nn.Sequential(nn.Conv1d(1, 8, 5, padding=2), nn.ReLU(), nn.Conv1d(8, 1, 5, padding=2))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config["lr"])
        self.lr_scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.3)
        g = torch.Generator().manual_seed(config["seed"])
        loader = [{"input": x, "target": x.roll(3, -1)} for x in torch.randn(6, 8, 1, 64, generator=g)]
        self.train_worker = Trainer(config, self.model, loader, {"mse": (F.mse_loss, 1.0)}, self.optimizer,
                                    self.lr_scheduler)
        self.start_epoch = 1
        self.monitor_best = np.inf
        self.checkpoint_dir = config["save_dir"]
        if resume is not None:
            self._resume_checkpoint(resume)

    def _save_checkpoint(self, epoch):
        state = {
            "arch": type(self.model).__name__,
            "epoch": epoch,
            "state_dict": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "monitor_best": self.monitor_best,
            "config": self.config,
        }
        filename = os.path.join(self.checkpoint_dir, f"checkpoint-epoch{epoch}.pth")
        torch.save(state, filename)  # BUG

    def _resume_checkpoint(self, resume_path):
        checkpoint = torch.load(resume_path, weights_only=False)
        self.start_epoch = checkpoint["epoch"] + 1
        self.monitor_best = checkpoint["monitor_best"]
        self.model.load_state_dict(checkpoint["state_dict"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])

    def train(self, epochs):
        logs = []
        for epoch in range(self.start_epoch, epochs + 1):
            logs.append(self.train_worker.run(epoch))
            self.monitor_best = min(self.monitor_best, logs[-1]["loss"])
            self._save_checkpoint(epoch)
        return logs


config = {"seed": 0, "lr": 1e-2, "save_dir": save_dir}
if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    TrainingPipeline(dict(config, seed=1)).train(4)
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", save_dir], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
pipeline = TrainingPipeline(config, resume=os.path.join(save_dir, "checkpoint-epoch4.pth"))
logs = pipeline.train(9)
print("after each resumed epoch, LR: " + ", ".join(f"{log['epoch']}: {log['lr']:.1e}" for log in logs)
      + " (StepLR(3, 0.3) from epoch 1 gives 9.0e-04 after epoch 6 and 2.7e-04 after epoch 9)")

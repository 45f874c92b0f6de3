# Source: https://github.com/deepmodeling/Uni-Mol/issues/173
# Original: deepmodeling/Uni-Mol (a user's own loss class for the Uni-Core trainer: forward returning
# loss, sample_size, logging_output; reduce_metrics feeding metrics.log_scalar); from the issue text
# Bug: the custom loss puts the loss tensor itself in logging_output ("loss": loss, without .data). reduce_metrics
# sums the logging outputs into a logged running meter, whose sum keeps each step's autograd graph: host memory
# grows with every training step (the author found it by comparing "loss": loss with "loss": loss.data).
from collections import OrderedDict

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class RunningMeter:
    def __init__(self):
        self.sum, self.count = 0, 0

    def update(self, value, weight):
        self.sum = self.sum + value * weight  # BUG
        self.count += weight

    @property
    def avg(self):
        return self.sum / max(self.count, 1)


class metrics:
    meters = OrderedDict()

    @classmethod
    def log_scalar(cls, key, value, weight=1):
        cls.meters.setdefault(key, RunningMeter()).update(value, weight)


class UnicoreLoss(torch.nn.Module):
    def __init__(self, task):
        super().__init__()
        self.task = task


class AffinityLoss(UnicoreLoss):
    """The user's loss: an MSE on a predicted binding affinity."""

    def forward(self, model, sample, reduce=True):
        pred = model(sample["net_input"]).squeeze(-1)
        loss = F.mse_loss(pred, sample["target"], reduction="sum" if reduce else "none")
        sample_size = sample["target"].size(0)
        logging_output = {"loss": loss, "sample_size": sample_size, "bsz": sample_size}
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs, split="valid"):
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss_sum / sample_size, sample_size)


class Trainer:
    def __init__(self, model, loss, optimizer):
        self.model, self.loss, self.optimizer = model, loss, optimizer

    def train_step(self, samples):
        self.model.train()
        self.optimizer.zero_grad()
        logging_outputs, sample_size = [], 0
        for sample in samples:
            loss, sample_size_i, logging_output = self.loss(self.model, sample)
            loss.backward()
            logging_outputs.append(logging_output)
            sample_size += sample_size_i
        for p in self.model.parameters():
            p.grad.div_(sample_size)
        self.optimizer.step()
        self.loss.reduce_metrics(logging_outputs, split="train")


model = torch.nn.Sequential(torch.nn.Linear(96, 192), torch.nn.SiLU(), torch.nn.Linear(192, 192), torch.nn.SiLU(),
                            torch.nn.Linear(192, 1))
trainer = Trainer(model, AffinityLoss(task=None), torch.optim.Adam(model.parameters(), lr=3e-4))
w = torch.randn(96)
for step in range(1, 201):
    samples = []
    for _ in range(2):
        x = torch.randn(16, 96)
        samples.append({"net_input": x, "target": torch.tanh(x @ w / 10)})
    trainer.train_step(samples)
    if step % 50 == 0:
        print("step", step, "loss", round(float(metrics.meters["loss"].avg), 4))

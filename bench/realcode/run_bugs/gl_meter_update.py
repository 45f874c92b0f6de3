# Source: synthetic: run15 line shape
# Original: none: a running-average meter object updated from a trainer method with the loss tensor; the meter
# also counts its updates (`self.count += 1`) in another of its methods; synthetic data
# Bug: `self.total = self.total + value * n` chains every step's graph onto the meter's total: memory grows.
import torch
from torch import nn
from torch.nn import functional as F


class AverageMeter:
    def __init__(self):
        self.total = 0.0
        self.n = 0
        self.count = 0

    def tick(self):
        self.count += 1

    def describe(self):
        return f"{self.count} updates, average {self.average():.4f}"

    def average(self):
        return float(self.total) / max(self.n, 1)

    def update(self, value, n=1):
        self.total = self.total + value * n  # BUG
        self.n = self.n + n
        self.tick()


class Trainer:
    def __init__(self):
        self.model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.meter = AverageMeter()

    def step(self, x):
        loss = F.mse_loss(self.model(x), x)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.meter.update(loss, x.shape[0])


torch.manual_seed(0)
trainer = Trainer()
for step in range(80):
    trainer.step(torch.randn(128, 256))
print(trainer.meter.describe())

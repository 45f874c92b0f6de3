# Source: synthetic: run15 line shape
# Original: none: a hand-written binary cross-entropy written over two lines in a criterion module, called from a
# trainer method; large inputs and a large learning rate saturate the sigmoid; synthetic data
# Bug: once a sigmoid output rounds to 1.0, `torch.log(1 - pred)` is log(0) = -inf and the loss turns NaN.
import torch
from torch import nn


class BCE(nn.Module):
    def forward(self, pred, target):
        loss = -(target * torch.log(pred)
                 + (1 - target) * torch.log(1 - pred))  # BUG
        return loss.mean()


class Trainer:
    def __init__(self, model):
        self.model = model
        self.criterion = BCE()
        self.optimizer = torch.optim.SGD(model.parameters(), lr=5.0)

    def compute_loss(self, x, y):
        return self.criterion(torch.sigmoid(self.model(x)), y)

    def train_step(self, x, y):
        loss = self.compute_loss(x, y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


torch.manual_seed(0)
trainer = Trainer(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
for step in range(60):
    x = torch.randn(32, 8) * 4
    y = (x[:, :1] > 0).float()
    last = trainer.train_step(x, y)
print("loss", last)

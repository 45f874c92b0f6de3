# Source: synthetic: run15 line shape (the backward through a trainer's own backward() method)
# Bug: a trainer class sends every loss through its backward() method (backward, then gradient clipping);
# train_step() calls it and steps the optimizer, but nothing ever clears the gradients, so every update sums the
# gradients of all earlier batches. zero_grad() belongs in train_step, before the backward it calls.
# `healthy` clears the gradients at the top of train_step.
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
HEALTHY = "healthy" in sys.argv[1:]


class Trainer:
    def __init__(self, model, lr=0.01, clip=5.0):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=lr)
        self.clip = clip

    def backward(self, loss):
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)

    def train_step(self, x, y):
        if HEALTHY:
            self.opt.zero_grad()
        out = self.model(x)
        loss = nn.functional.mse_loss(out, y)
        self.backward(loss)  # BUG
        self.opt.step()
        return loss.item()


trainer = Trainer(nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Linear(24, 1)))
for epoch in range(3):
    for _ in range(10):
        x = torch.randn(16, 6)
        last = trainer.train_step(x, x.sum(1, keepdim=True))
    print(f"epoch {epoch} loss {last:.4f}")
print("done")

# Source: synthetic: run15 line shape
# Original: none: a progress line formatted from the loss tensor in a helper, every step; synthetic data
# Bug: `f"{loss:.4f}"` formats a tensor, which copies its value to the host: one sync per step.
import torch
from torch import nn
from torch.nn import functional as F


def progress(step, loss):
    return f"step {step} loss {loss:.4f}"  # BUG


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
lines = []
for step in range(60):
    x = torch.randn(64, 32)
    loss = F.mse_loss(model(x), x[:, :1])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    lines.append(progress(step, loss.detach()))
print(lines[-1])

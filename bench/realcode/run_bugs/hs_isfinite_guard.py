# Source: synthetic: run15 line shape
# Original: none: a guard that skips a step whose loss is not finite, written as an `if` on a tensor in the loop;
# synthetic data
# Bug: `if not torch.isfinite(loss)` converts a tensor to bool: one host-device sync per step.
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(60):
    x = torch.randn(64, 32)
    loss = F.mse_loss(model(x), x[:, :1])
    if not torch.isfinite(loss):  # BUG
        continue
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("loss", float(loss))

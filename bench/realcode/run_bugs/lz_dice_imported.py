# Source: synthetic: run15 line shape
# Original: none: a log-Dice loss in the project's own losses module, imported by the training script; ReLU
# predictions are exactly 0 for some samples; synthetic multi-label data
# Bug: a sample whose predictions are all 0 has intersection 0, so `torch.log(2 * inter / union)` is log(0) = -inf
# at step 1; the backward writes inf/NaN into the weights and no later step makes a finite value non-finite
# (the BUG line is in lz_dice_imported_pkg/losses.py).
import torch
from torch import nn

from lz_dice_imported_pkg.losses import soft_dice_log

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 6))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(30):
    x = torch.randn(32, 8)
    target = (torch.rand(32, 6) > 0.5).float()
    pred = torch.relu(model(x))
    loss = soft_dice_log(pred, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("loss", loss.item())

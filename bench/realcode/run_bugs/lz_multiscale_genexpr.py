# Source: synthetic: run15 line shape
# Original: none: a loss summed over scales in a generator expression written over three lines, inline in the
# training loop; the scales are ReLU outputs, some exactly 0; synthetic data
# Bug: `torch.log(p)` of an exact 0 is -inf, so the loss is inf from step 1 and stays inf (an inf loss that never
# changes once crashed the report).
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 12))
nn.init.constant_(model[2].bias, -0.5)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(40):
    x = torch.randn(32, 8)
    out = F.relu(model(x))
    target = torch.rand(32, 4)
    loss = sum(
        -(target * torch.log(p)).mean()  # BUG
        for p in out.split(4, dim=1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("loss", loss.item())

# Source: synthetic: run15 line shape
# Original: none: a prediction head that adds the log of its features' variance, inside the model's forward (a
# submodule of nn.Sequential); its ReLU features are all 0 for some samples; synthetic data
# Bug: a sample whose features are all 0 has variance 0, `torch.log(var)` is -inf, and the loss is inf from step 1
# (an inf loss that never changes once crashed the report).
import torch
from torch import nn


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)
        nn.init.constant_(self.fc.bias, -1.5)

    def forward(self, h):
        z = torch.relu(self.fc(h))
        var = z.var(dim=1, keepdim=True)
        return torch.log(var) + z  # BUG


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), Head())
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
for step in range(40):
    x = torch.randn(32, 8)
    loss = ((model(x) - 1) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("loss", loss.item())

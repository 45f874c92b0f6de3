"""Keeps every loss with its graph: CUDA memory grows each step."""
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
losses = []
for step in range(300):
    x = torch.randn(512, 1024, device="cuda")
    loss = (model(x) - x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss)
print(sum(losses).item() / len(losses))

"""Reads the loss and a data-dependent count back to the host every step."""
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
history = []
for step in range(400):
    x = torch.randn(256, 2048, device="cuda")
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history.append(loss.item())
    active = torch.nonzero(x > 3.0).shape[0]
    if step % 100 == 0:
        print(step, history[-1], active)

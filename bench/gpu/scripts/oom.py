"""A batch far too large for the card: a real CUDA OOM in the forward pass."""
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(4096, 16384), nn.GELU(), nn.Linear(16384, 16384), nn.GELU(),
                      nn.Linear(16384, 10)).cuda()
optimizer = torch.optim.AdamW(model.parameters())
for step in range(3):
    x = torch.randn(400_000, 4096, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()

# Source: synthetic: run15 line shape (scheduler.step() behind a condition that never holds)
# Bug: the cosine schedule is stepped only when the global step is a multiple of the logging interval and the
# epoch is past warm-up, a condition copied from the logging code that never holds in this run: the schedule is
# never stepped and the learning rate stays at its start. The line to change is that scheduler.step().
# `healthy` steps it after every optimizer step.
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
HEALTHY = "healthy" in sys.argv[1:]

model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
batches = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(15)]
epochs = 3
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * len(batches))
log_every = 100
step = 0
for epoch in range(epochs):
    for x, y in batches:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        step += 1
        if step % log_every == 0:
            print(f"step {step} loss {loss.item():.4f}")
        if HEALTHY or (step % log_every == 0 and epoch > 1):
            scheduler.step()  # BUG
print("done")

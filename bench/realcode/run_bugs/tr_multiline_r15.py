# Source: synthetic: run15 line shape (the validation call written over several lines)
# Bug: validate() puts the model in eval mode and returns without restoring train mode; the epoch loop calls
# it in a call written over five lines and never calls model.train() again, so every epoch after the first
# trains with dropout and batch norm in eval mode. `# BUG` is on the first line of the call, where
# model.train() must follow. `healthy` restores train mode after the call.
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
HEALTHY = "healthy" in sys.argv[1:]


def validate(net, batches, criterion, log_every=1, prefix="val"):
    net.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in batches:
            total += criterion(net(x), y).item()
    return {f"{prefix}_loss": total / len(batches), "every": log_every}


net = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
criterion = nn.MSELoss()
train_batches = [(torch.randn(16, 12), torch.randn(16, 1)) for _ in range(10)]
val_batches = [(torch.randn(16, 12), torch.randn(16, 1)) for _ in range(2)]
net.train()
for epoch in range(3):
    for x, y in train_batches:
        opt.zero_grad()
        loss = criterion(net(x), y)
        loss.backward()
        opt.step()
    metrics = validate(  # BUG
        net,
        val_batches,
        criterion,
        log_every=1,
        prefix="valid",
    )
    if HEALTHY:
        net.train()
    print(f"epoch {epoch} {metrics}")
print("done")

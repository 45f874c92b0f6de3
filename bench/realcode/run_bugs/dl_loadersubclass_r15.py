# Source: synthetic: run15 line shape (a DataLoader subclass built inside the epoch loop)
# Bug: the project's own DataLoader subclass (it fixes the worker count and the collate in its __init__) is
# constructed again at the top of every epoch; each construction starts its worker processes from scratch.
# The line to change is the construction in the epoch loop, not the super().__init__ inside the subclass.
# `healthy` builds the loader once before the loop, with persistent workers.
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
HEALTHY = "healthy" in sys.argv[1:]


class WorkerLoader(DataLoader):
    def __init__(self, dataset, batch_size, shuffle=True):
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=2, drop_last=True,
                         persistent_workers=HEALTHY)


data = TensorDataset(torch.randn(96, 12), torch.randint(0, 3, (96,)))
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.CrossEntropyLoss()
fixed = WorkerLoader(data, batch_size=16) if HEALTHY else None
for epoch in range(4):
    loader = fixed or WorkerLoader(data, batch_size=16)  # BUG
    for x, y in loader:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
print("done")

# Source: synthetic: run15 line shape (a DataLoader construction over several lines inside the epoch loop)
# Bug: the training loader is built inside the epoch loop by a call written over several lines, its worker
# count on the last of them; every epoch starts new worker processes. `# BUG` is on the first line of the call.
# `healthy` builds it once before the loop.
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
HEALTHY = "healthy" in sys.argv[1:]
cfg = {"batch_size": 16, "workers": 2, "epochs": 4}
train_set = TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,)))
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
built = None
if HEALTHY:
    built = DataLoader(train_set, batch_size=cfg["batch_size"], shuffle=True, num_workers=cfg["workers"],
                       persistent_workers=True)
for epoch in range(cfg["epochs"]):
    train_loader = built or DataLoader(  # BUG
        train_set,
        batch_size=cfg["batch_size"],
        shuffle=True,
        drop_last=False,
        num_workers=cfg["workers"],
    )
    for x, y in train_loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
print("done")

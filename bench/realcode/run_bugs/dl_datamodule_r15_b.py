# Source: synthetic: run15 line shape (a data module's loader method called inside the epoch loop)
# Bug: a small data-module class (the Lightning DataModule habit, without Lightning) returns a new DataLoader
# with worker processes from train_loader(); the hand-written epoch loop calls it at the top of every epoch, so
# the workers start from scratch each epoch. The fix moves the call out of the loop (the method itself is fine
# when called once). `healthy` calls it once before the loop.
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
HEALTHY = "healthy" in sys.argv[1:]


class DataModule:
    def __init__(self, n=96, batch_size=16, workers=2):
        self.train_set = TensorDataset(torch.randn(n, 10), torch.randn(n, 1))
        self.batch_size = batch_size
        self.workers = workers

    def train_loader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.workers,
                          persistent_workers=HEALTHY)


def fit(model, dm, epochs):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    once = dm.train_loader() if HEALTHY else None
    for epoch in range(epochs):
        loader = once if HEALTHY else dm.train_loader()  # BUG
        total = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch} loss {total / len(loader):.4f}")


fit(nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 1)), DataModule(), 4)
print("done")

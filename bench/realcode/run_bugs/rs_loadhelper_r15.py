# Source: synthetic: run15 line shape (a checkpoint helper whose optimizer argument the resume call leaves out)
# Bug: load_checkpoint(path, model, optimizer=None) restores the optimizer only when it is given one; the resume
# path of main() calls it with the model alone, so the Adam moments saved in the checkpoint are never loaded and
# the continued run starts its optimizer from scratch. The line to change is the call that leaves the optimizer
# out. `healthy` passes the optimizer.
import os
import sys
import tempfile

import torch
import torch.nn as nn

HEALTHY = "healthy" in sys.argv[1:]
out = tempfile.mkdtemp()
path = os.path.join(out, "last.pt")


def save_checkpoint(path, model, optimizer, epoch):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)


def load_checkpoint(path, model, optimizer=None):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state["epoch"] + 1


def main(epochs, resume):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = 0
    if resume and os.path.exists(path):
        if HEALTHY:
            start = load_checkpoint(path, model, optimizer)
        else:
            start = load_checkpoint(path, model)  # BUG
    for epoch in range(start, epochs):
        for _ in range(8):
            x, y = torch.randn(16, 12), torch.randint(0, 3, (16,))
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        save_checkpoint(path, model, optimizer, epoch)
    print(f"epochs {start}..{epochs - 1} done")


main(2, resume=False)
main(4, resume=True)
print("done")

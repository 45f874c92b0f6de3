# Source: https://github.com/D-X-Y/NAS-Bench-201/issues/19 (the maintainer's diagnosis: "You should also save the state
#   of scheduler in the checkpoint, and resume it from checkpoint ... Therefore, you got the wrong learning rate")
# Original: the reporter's imagenet_train.py (the pytorch/examples ImageNet loop with a torch.optim.lr_scheduler
#   scheduler added; linked from the issue as a gist)
# Bug: the checkpoint holds the epoch, the weights and the optimizer but not the scheduler; --resume restores the
# optimizer (its decayed LR included) and keeps the scheduler just built, whose count starts again at zero, so every
# milestone after the resume comes start_epoch epochs late (here: the drop due at epoch 8 comes at epoch 10, the one
# due at epoch 12 never).
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
from torch.optim import lr_scheduler

ckpt_dir = tempfile.mkdtemp()
RESUME = os.path.join(ckpt_dir, "checkpoint.pth.tar")

# The interrupted run (its own process): epochs 0-5 with the same loop, milestone 4 passed (LR 0.1 -> 0.01).
subprocess.run([sys.executable, "-c", (
    "import torch\n"
    "torch.manual_seed(1)\n"
    "m = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))\n"
    "o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)\n"
    "s = torch.optim.lr_scheduler.MultiStepLR(o, milestones=[4, 8, 12], gamma=0.1)\n"
    "for epoch in range(6):\n"
    "    for _ in range(6):\n"
    "        o.zero_grad(); torch.nn.functional.cross_entropy(m(torch.randn(32, 20)), torch.randint(0, 5, (32,))).backward(); o.step()\n"
    "    s.step()\n"
    f"torch.save({{'epoch': 6, 'state_dict': m.state_dict(), 'best_prec1': 0.0, 'optimizer': o.state_dict()}}, {RESUME!r})\n")],
    check=True, env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", default=14, type=int)
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("--resume", default=RESUME, type=str)
parser.add_argument("--start-epoch", default=0, type=int)
args = parser.parse_args([])


def train(loader, model, criterion, optimizer, g):
    model.train()
    for _ in range(loader):
        x, y = torch.randn(32, 20, generator=g), torch.randint(0, 5, (32,), generator=g)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def save_checkpoint(state, filename):
    torch.save(state, filename)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = lr_scheduler.MultiStepLR(optimizer, milestones=[4, 8, 12], gamma=0.1)
    best_prec1 = 0.0
    if args.resume and os.path.isfile(args.resume):
        checkpoint = torch.load(args.resume)
        args.start_epoch = checkpoint["epoch"]
        best_prec1 = checkpoint["best_prec1"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])  # BUG
    g = torch.Generator().manual_seed(2)
    lrs = []
    for epoch in range(args.start_epoch, args.epochs):
        lrs.append(optimizer.param_groups[0]["lr"])
        train(6, model, criterion, optimizer, g)
        scheduler.step()
        save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(), "best_prec1": best_prec1,
                         "optimizer": optimizer.state_dict()}, args.resume)
    print("LR per resumed epoch", list(range(args.start_epoch, args.epochs)), [f"{v:.0e}" for v in lrs])


if __name__ == "__main__":
    main()

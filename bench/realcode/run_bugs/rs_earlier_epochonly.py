# Source: synthetic: state 3 of run14 (a resume from a file an earlier run wrote, holding the epoch and the weights)
# Original: our own; an argparse script with --resume, whose earlier job ran in its own process
# Bug: the earlier job's checkpoint holds {'epoch', 'model'} and no optimizer state; `--resume` restores the weights and
# the epoch into a new model and a new Adam, so the continued run starts its moments from zero.
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--resume", default="")
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--save", default="")
args = parser.parse_args()

if not args.resume and not args.save:
    # the earlier job, in its own process (as a preempted and restarted job is)
    path = os.path.join(tempfile.mkdtemp(), "model_last.pth")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    subprocess.run([sys.executable, __file__, "--epochs", "3", "--save", path], check=True, env=env)
    args.resume = path

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
start_epoch = 0
if args.resume:
    checkpoint = torch.load(args.resume, map_location="cpu")
    model.load_state_dict(checkpoint["model"])  # BUG
    start_epoch = checkpoint["epoch"] + 1
    print(f"resumed from epoch {checkpoint['epoch']}")

g = torch.Generator().manual_seed(1)
for epoch in range(start_epoch, args.epochs):
    for _ in range(8):
        x, y = torch.randn(32, 20, generator=g), torch.randint(0, 5, (32,), generator=g)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    if args.save:
        torch.save({"epoch": epoch, "model": model.state_dict()}, args.save)
print("done at epoch", args.epochs - 1)

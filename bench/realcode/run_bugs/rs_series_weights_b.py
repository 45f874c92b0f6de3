# Source: synthetic: state 2 of run14 (weights-only checkpoints, resumed from the latest with a fresh optimizer)
# Original: our own; a step loop writing ckpt_<step>.pt every 10 steps, and a resume that picks the latest one
# Bug: the periodic checkpoints hold only the weights and the step; the resume reads the latest of them back into
# a freshly built model and optimizer and goes on writing the same series: AdamW's moments restart from zero at
# every resume (the save should write optimizer.state_dict() and the resume load it).
import glob
import os
import tempfile

import torch
import torch.nn.functional as F

ckpt_dir = tempfile.mkdtemp()


def train(total_steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.GELU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    step = 0
    found = sorted(glob.glob(os.path.join(ckpt_dir, "ckpt_*.pt")), key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
    if found:
        state = torch.load(found[-1])
        model.load_state_dict(state["model"])  # BUG
        step = state["step"]
        print(f"resuming from {os.path.basename(found[-1])} at step {step}")
    g = torch.Generator().manual_seed(step)
    while step < total_steps:
        x = torch.randn(16, 6, generator=g)
        loss = F.mse_loss(model(x), x[:, :2] * 0.5)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 10 == 0:
            torch.save({"model": model.state_dict(), "step": step}, os.path.join(ckpt_dir, f"ckpt_{step}.pt"))
    print(f"step {step} loss {loss.item():.4f}")


train(30)   # the first job
train(60)   # the job that continues it

# Source: synthetic: state 4 of run14 (loads whose results go into the model through another path)
# Original: our own; a checkpoint written as three files per step (model.pt, optim.pt, sched.pt), restored by a helper
# that renames the keys and copies them into the parameters
# Bug: the resume copies the weights into the parameters in place (no load_state_dict) and restores the scheduler's
# position from sched.pt, but never reads optim.pt: the continued Adam starts with empty moments.
import os
import tempfile

import torch
import torch.nn.functional as F

ckpt = tempfile.mkdtemp()


def strip_prefix(state):
    return {k.removeprefix("module."): v for k, v in state.items()}


def copy_into(model, state):
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


def run(until, resume_step=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    step = 0
    if resume_step is not None:
        folder = os.path.join(ckpt, f"step_{resume_step}")
        copy_into(model, strip_prefix(torch.load(os.path.join(folder, "model.pt"))))  # BUG
        sched = torch.load(os.path.join(folder, "sched.pt"))
        scheduler.last_epoch, step = sched["scheduler"]["last_epoch"], sched["step"]
    while step < until:
        x = torch.randn(16, 10)
        optimizer.zero_grad()
        F.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
        optimizer.step()
        scheduler.step()
        step += 1
        if step % 10 == 0:
            folder = os.path.join(ckpt, f"step_{step}")
            os.makedirs(folder, exist_ok=True)
            torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, os.path.join(folder, "model.pt"))
            torch.save(optimizer.state_dict(), os.path.join(folder, "optim.pt"))
            torch.save({"scheduler": scheduler.state_dict(), "step": step}, os.path.join(folder, "sched.pt"))
    print("ended at", step, "lr", scheduler.get_last_lr()[0])


run(50)
run(100, resume_step=50)

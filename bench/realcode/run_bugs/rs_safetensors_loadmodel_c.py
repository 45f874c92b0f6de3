# Source: synthetic: state 5 of run14 (safetensors.torch.load_model in a resume, the run writing the same file again)
# Original: our own; a step loop that keeps last.safetensors (weights) and last_state.pt (the step) up to date
# Bug: the periodic checkpoint is the weights (safetensors) and the step; the continued job restores both through
# safetensors' load_model and a small state file, builds a new SGD with momentum and writes the same files again:
# the momentum buffers restart at zero on every resume.
import os
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model

ckpt_dir = tempfile.mkdtemp()


def job(max_steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    step = 0
    if os.path.exists(os.path.join(ckpt_dir, "last_state.pt")):
        load_model(model, os.path.join(ckpt_dir, "last.safetensors"))  # BUG
        step = torch.load(os.path.join(ckpt_dir, "last_state.pt"))["step"]
    g = torch.Generator().manual_seed(step)
    while step < max_steps:
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        step += 1
        if step % 10 == 0:
            save_model(model, os.path.join(ckpt_dir, "last.safetensors"))
            torch.save({"step": step}, os.path.join(ckpt_dir, "last_state.pt"))
    print("job ended at step", step)


job(20)
job(40)

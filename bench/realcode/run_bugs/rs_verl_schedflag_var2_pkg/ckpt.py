"""Checkpoint helpers of rs_verl_schedflag_var2 (variant of rs_verl_schedflag_b; the code is ours)."""
import os

import torch


def write(path, m, o, step):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"weights": m.state_dict(), "optim": o.state_dict(), "step": step}, path)


def read(path, m, o=None):
    blob = torch.load(path, map_location="cpu")
    m.load_state_dict(blob["weights"])
    step = int(blob.get("step", 0))
    if step:
        print(f"loaded weights at step {step}")
    if o is not None and "optim" in blob:  # BUG
        o.load_state_dict(blob["optim"])
    return step

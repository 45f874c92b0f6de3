# Source: https://github.com/verl-project/verl/issues/7953 (variant of rs_verl_schedflag_b: the restore leaves the
#   optimizer's state out, here through Lightning Fabric's save/load; the code is ours)
# Bug: the loop writes its checkpoint with fabric.save(path, {"model", "optimizer", "step"}) but the resume builds the
# state it hands to fabric.load() without the optimizer: Fabric restores exactly the keys it is given, so the weights
# and the step come back and AdamW's moments start from zero in every continued run.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.fabric import Fabric

root = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
ckpt_path = os.path.join(root, "last.ckpt")


def setup(seed):
    fabric = Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    return fabric, model, optimizer


def loop(fabric, model, optimizer, state, stop, g):
    model.train()
    while state["step"] < stop:
        x = torch.randn(8, 16, generator=g)
        loss = F.mse_loss(model(x), x.cumsum(-1) / 4)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        state["step"] += 1
        if state["step"] % 10 == 0:
            fabric.save(ckpt_path, {"model": model, "optimizer": optimizer, "step": state["step"]})


if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    f, m, o = setup(1)
    loop(f, m, o, {"step": 0}, 30, torch.Generator().manual_seed(1))
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", root], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
fabric, model, optimizer = setup(0)
state = {"model": model, "step": 0}
remainder = fabric.load(ckpt_path, state)  # BUG
held = len(optimizer.optimizer.state)
loop(fabric, model, optimizer, state, 60, torch.Generator().manual_seed(2))
print(f"resumed at step 30 (left unread in the file: {sorted(remainder)}); AdamW held {held} tensors' state at its "
      "first continued step")

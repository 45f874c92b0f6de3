# Source: https://github.com/KempnerInstitute/KempnerForge/pull/115
# Original: KempnerInstitute/KempnerForge checkpoint manager (CheckpointManager.save / CheckpointManager.load)
# Bug: the resume round-trips the optimizer through a template made from the freshly built optimizer's own
# state_dict(); AdamW creates its moments lazily at the first step, so the template has no exp_avg/exp_avg_sq
# entries, the load fills only what the template holds, and the saved moments are silently dropped: the
# weights, step counter and LR come back, Adam's moments restart at zero.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)
ckpt_dir = tempfile.mkdtemp()

# The earlier run (its own process, as a resumed job is): weights and optimizer state after 20 steps.
subprocess.run([sys.executable, "-c", (
    "import torch\n"
    "torch.manual_seed(1)\n"
    "m = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))\n"
    "o = torch.optim.AdamW(m.parameters(), lr=3e-4)\n"
    "for _ in range(20):\n"
    "    o.zero_grad(); torch.nn.functional.cross_entropy(m(torch.randn(16, 10)), torch.randint(0, 4, (16,))).backward(); o.step()\n"
    f"torch.save({{'model': m.state_dict(), 'optimizer': o.state_dict(), 'step': 20}}, {os.path.join(ckpt_dir, 'state.pt')!r})\n")],
    check=True, env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})


def fill_template(template, saved):
    # Copies saved values into the keys the template already has (as a distributed checkpoint load does).
    if isinstance(template, dict):
        return {k: fill_template(v, saved[k]) if k in saved else v for k, v in template.items()}
    return saved


class CheckpointManager:
    def __init__(self, ckpt_dir, model, optimizer):
        self.ckpt_dir, self.model, self.optimizer = ckpt_dir, model, optimizer

    def load(self):
        saved = torch.load(os.path.join(self.ckpt_dir, "state.pt"))
        self.model.load_state_dict(saved["model"])
        template = self.optimizer.state_dict()  # BUG
        self.optimizer.load_state_dict(fill_template(template, saved["optimizer"]))
        return saved["step"]


model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
step = CheckpointManager(ckpt_dir, model, optimizer).load()
g = torch.Generator().manual_seed(2)
while step < 80:
    x, y = torch.randn(16, 10, generator=g), torch.randint(0, 4, (16,), generator=g)
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    step += 1
print("resumed to step", step, "state entries", len(optimizer.state))

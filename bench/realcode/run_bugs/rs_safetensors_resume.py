# Source: synthetic: state 5 of run14 (a resume whose weights come through safetensors, not torch.load)
# Original: our own; checkpoint-<step>/ folders with model.safetensors (safetensors.torch.save_file) and optimizer.pt
# Bug: the earlier job wrote each checkpoint folder with the weights in model.safetensors and the optimizer's state in
# optimizer.pt; the resume reads the weights with safetensors' load_file and never opens optimizer.pt, so the
# continued AdamW starts with empty moments.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

OUT = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.SiLU())
        self.out = torch.nn.Linear(48, 1)

    def forward(self, x):
        return self.out(self.encoder(x))


def fit(model, optimizer, start, stop, save_every=0):
    g = torch.Generator().manual_seed(start)
    for step in range(start, stop):
        x = torch.randn(32, 12, generator=g)
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if save_every and (step + 1) % save_every == 0:
            folder = os.path.join(OUT, f"checkpoint-{step + 1}")
            os.makedirs(folder, exist_ok=True)
            save_file(model.state_dict(), os.path.join(folder, "model.safetensors"))
            torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))
    return loss.item()


torch.manual_seed(0)
model = Regressor()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    print("first job loss", fit(model, optimizer, 0, 30, save_every=15))
    sys.exit(0)

env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
subprocess.run([sys.executable, __file__, "--first-job", OUT], check=True, env=env)
latest = os.path.join(OUT, "checkpoint-30")
model.load_state_dict(load_file(os.path.join(latest, "model.safetensors")))  # BUG
print("resumed loss", fit(model, optimizer, 30, 60))

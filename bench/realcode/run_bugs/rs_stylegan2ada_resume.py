# Source: https://github.com/NVlabs/stylegan2-ada-pytorch/issues/108
# Original: NVlabs/stylegan2-ada-pytorch training/training_loop.py (resume_pkl)
# Bug: resuming copies G, D and G_ema weights from the snapshot but the Adam optimizers are built fresh
# and their states are never restored: the resumed run restarts both Adams from empty moments.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)
run_dir = tempfile.mkdtemp()
resume_pkl = os.path.join(run_dir, "network-snapshot-000040.pt")
# The previous run's snapshot (written by a separate process, as the earlier run would have).
subprocess.run([sys.executable, "-c", (
    "import torch\n"
    "torch.manual_seed(1)\n"
    "G = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 32))\n"
    "D = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))\n"
    f"torch.save({{'G': G.state_dict(), 'D': D.state_dict(), 'G_ema': G.state_dict()}}, {resume_pkl!r})\n")],
    check=True, env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})

G = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 32))
D = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))
G_ema = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 32))
if resume_pkl is not None:
    resume_data = torch.load(resume_pkl)
    for name, module in [("G", G), ("D", D), ("G_ema", G_ema)]:
        module.load_state_dict(resume_data[name])  # BUG
G_opt = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.0, 0.99))
D_opt = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.0, 0.99))

for cur_tick in range(30):
    real = torch.randn(16, 32)
    D_opt.zero_grad()
    d_loss = F.softplus(D(G(torch.randn(16, 8)).detach())).mean() + F.softplus(-D(real)).mean()
    d_loss.backward()
    D_opt.step()
    G_opt.zero_grad()
    g_loss = F.softplus(-D(G(torch.randn(16, 8)))).mean()
    g_loss.backward()
    G_opt.step()
print("done")

# Source: https://github.com/fredzzhang/spatially-conditioned-graphs/issues/22
# Original: fredzzhang/spatially-conditioned-graphs main.py (--model-path) and the engine's checkpoints
# Bug: continuing from a checkpoint given with --model-path restores the network's weights only; the
# checkpoint also holds the optimizer's and the LR scheduler's state, which are never loaded, so AdamW
# restarts with empty moment estimates and the schedule restarts from its first step.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)
cache_dir = tempfile.mkdtemp()
model_path = os.path.join(cache_dir, "ckpt_00512_04.pt")
subprocess.run([sys.executable, "-c", (
    "import torch\n"
    "net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))\n"
    "opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=1e-4)\n"
    "sched = torch.optim.lr_scheduler.MultiStepLR(opt, [40])\n"
    "for _ in range(20):\n"
    "    opt.zero_grad(); net(torch.randn(4, 32)).pow(2).mean().backward(); opt.step(); sched.step()\n"
    "torch.save({'iteration': 20, 'epoch': 4, 'model_state_dict': net.state_dict(),\n"
    "            'optim_state_dict': opt.state_dict(), 'scheduler_state_dict': sched.state_dict()},\n"
    f"           {model_path!r})\n")],
    check=True, env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})

net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
if os.path.exists(model_path):
    print(f"=> Continue from saved checkpoint {model_path}")
    checkpoint = torch.load(model_path, map_location="cpu")
    net.load_state_dict(checkpoint["model_state_dict"])  # BUG
    epoch, iteration = checkpoint["epoch"], checkpoint["iteration"]
optim = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=1e-4)
lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optim, [40])
for ep in range(epoch, epoch + 3):
    for _ in range(15):
        x, target = torch.randn(4, 32), torch.randint(0, 8, (4,))
        loss = F.cross_entropy(net(x), target)
        optim.zero_grad()
        loss.backward()
        optim.step()
        lr_scheduler.step()
        iteration += 1
print("done")

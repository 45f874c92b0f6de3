# Source: https://github.com/amjltc295/pytorch-golden-template/issues/50 (variant of ck_goldentemplate_nosched_b: the
#   checkpoint leaves out the optimizer and the scheduler, here in a package's save helper that is handed both and
#   writes neither; the code is ours)
# Bug: ck_goldentemplate_nosched_var2_pkg/io.py save_ckpt(m, o, s, epoch, path) writes the weights and the epoch only;
# the package's load_ckpt would restore the optimizer and the scheduler if they were there, so a resume silently
# restarts both. The `# BUG` line is in io.py.
import os
import sys
import tempfile

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ck_goldentemplate_nosched_var2_pkg import io, loop  # noqa: E402

folder = tempfile.mkdtemp()
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1))
o = torch.optim.RMSprop(m.parameters(), lr=1e-3)
s = torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.7)
g = torch.Generator().manual_seed(0)
start = 0
if os.environ.get("RESUME_FROM"):
    start = io.load_ckpt(os.environ["RESUME_FROM"], m, o, s) + 1
for epoch in range(start, 6):
    batches = [(torch.randn(16, 20, generator=g), torch.randint(0, 2, (16,), generator=g).float()) for _ in range(5)]
    loop.run_epoch(m, batches, o, s)
    io.save_ckpt(m, o, s, epoch, os.path.join(folder, f"epoch_{epoch}.pt"))
print(f"saved {sorted(torch.load(os.path.join(folder, 'epoch_5.pt')))} each epoch; the RMSprop state and the "
      f"ExponentialLR (LR now {s.get_last_lr()[0]:.1e}) are not in them")

# Source: https://github.com/amjltc295/pytorch-golden-template/issues/50 (variant of ck_goldentemplate_nosched_b: a
#   checkpoint without the scheduler, here written as several files by a trainer with terse names; the code is ours)
# Bug: each epoch the trainer writes the weights and the optimizer as two files and resumes from both, but never
# writes the MultiStepLR it steps: a continued run restores Adam and the weights, and the step decay starts over.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

d = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()


class Tr:
    def __init__(self, seed):
        torch.manual_seed(seed)
        self.m = nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 2))
        self.o = torch.optim.Adam(self.m.parameters(), lr=1e-2)
        self.s = torch.optim.lr_scheduler.MultiStepLR(self.o, milestones=[3, 6], gamma=0.1)
        self.crit = nn.MSELoss()
        self.ep = 0
        self.g = torch.Generator().manual_seed(seed)

    def dump(self):
        torch.save(self.m.state_dict(), os.path.join(d, f"m_{self.ep}.pt"))  # BUG
        torch.save(self.o.state_dict(), os.path.join(d, f"o_{self.ep}.pt"))

    def load(self, ep):
        self.m.load_state_dict(torch.load(os.path.join(d, f"m_{ep}.pt")))
        self.o.load_state_dict(torch.load(os.path.join(d, f"o_{ep}.pt")))
        self.ep = ep

    def go(self, until):
        lrs = []
        while self.ep < until:
            for _ in range(6):
                x = torch.randn(12, 6, generator=self.g)
                self.o.zero_grad()
                self.crit(self.m(x), x[:, :2] * x[:, 2:4]).backward()
                self.o.step()
            self.s.step()
            self.ep += 1
            self.dump()
            lrs.append(self.o.param_groups[0]["lr"])
        return lrs


if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    Tr(1).go(4)
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", d], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
t = Tr(0)
t.load(4)
lrs = t.go(8)
print("resumed at epoch 4, LR after epochs 5-8: " + ", ".join(f"{lr:.0e}" for lr in lrs)
      + " (MultiStepLR([3, 6], 0.1) from epoch 0 gives 1e-03, 1e-04, 1e-04, 1e-04)")

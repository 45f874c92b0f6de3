# Source: https://github.com/verl-project/verl/issues/7953 (variant of rs_verl_schedflag_b: the same bug, a restore
#   skipped by a flag whose default is off, in another shape; the code is ours)
# Bug: a trainer class whose restore() brings back the weights, the step and the EMA of the loss from a checkpoint
# that this same trainer writes with the optimizer in it, but loads the optimizer's state only when a
# `load_optimizer` option is set, which defaults to off: every continued run restarts Adam's moments from zero.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

out = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()


class T:
    def __init__(self, opts, seed):
        torch.manual_seed(seed)
        self.opts = opts
        self.net = nn.Sequential(nn.Linear(10, 40), nn.SiLU(), nn.Linear(40, 1))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=2e-3, betas=(0.9, 0.99))
        self.crit = nn.SmoothL1Loss()
        self.it = 0
        self.ema = None
        self.g = torch.Generator().manual_seed(seed)

    def snapshot(self):
        torch.save({"net": self.net.state_dict(), "opt": self.opt.state_dict(), "it": self.it, "ema": self.ema},
                   os.path.join(out, "snapshot.pt"))

    def restore(self):
        ck = torch.load(os.path.join(out, "snapshot.pt"))
        self.net.load_state_dict(ck["net"])
        self.it = ck["it"]
        self.ema = ck["ema"]
        print(f"restored iteration {self.it}")
        if self.opts.get("load_optimizer", False):  # BUG
            self.opt.load_state_dict(ck["opt"])

    def fit(self, n):
        self.net.train()
        for _ in range(n):
            x = torch.randn(32, 10, generator=self.g)
            loss = self.crit(self.net(x), x[:, :3].sum(1, keepdim=True))
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.it += 1
            self.ema = loss.item() if self.ema is None else 0.9 * self.ema + 0.1 * loss.item()
            if self.it % 10 == 0:
                self.snapshot()


if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    T({}, 1).fit(30)
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", out], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
t = T({}, 0)
t.restore()
held = len(t.opt.state)
t.fit(30)
print(f"the snapshot holds Adam state for {len(torch.load(os.path.join(out, 'snapshot.pt'))['opt']['state'])} "
      f"tensors; the optimizer held {held} when it took its first continued step")

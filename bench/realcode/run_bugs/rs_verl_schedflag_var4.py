# Source: https://github.com/verl-project/verl/issues/7953 (variant of rs_verl_schedflag_b: a part of the training state
#   saved with the optimizer that the resume does not carry into the continued run; here the GradScaler, restored and
#   then replaced; the code is ours)
# Bug: the trainer's resume() restores the model, the optimizer and the GradScaler from its own checkpoint, but
# train() calls _setup_amp(), which builds a new GradScaler over the restored one (`# BUG` on that construction, as
# for an optimizer built anew after its restore): the continued run starts again at
# a loss scale of 2**16 and halves it step after step (skipping each of those steps) until it is back where the
# checkpoint had it.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()


class Runner:
    def __init__(self, seed):
        torch.manual_seed(seed)
        self.m = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
        self.o = torch.optim.Adam(self.m.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=1000)
        self.epoch = 0
        self.g = torch.Generator().manual_seed(seed)

    def _setup_amp(self):
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=1000)  # BUG

    def save(self):
        torch.save({"model": self.m.state_dict(), "optimizer": self.o.state_dict(),
                    "scaler": self.scaler.state_dict(), "epoch": self.epoch}, os.path.join(work, "ckpt.pt"))

    def resume(self):
        state = torch.load(os.path.join(work, "ckpt.pt"))
        self.m.load_state_dict(state["model"])
        self.o.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.epoch = state["epoch"]

    def train(self, epochs):
        self._setup_amp()
        skipped = 0
        for _ in range(epochs):
            for _ in range(8):
                x = torch.randn(16, 8, generator=self.g) * 30
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = F.mse_loss(self.m(x).float(), x.flip(-1))
                self.o.zero_grad()
                self.scaler.scale(loss).backward()
                before = self.scaler.get_scale()
                self.scaler.step(self.o)
                self.scaler.update()
                skipped += self.scaler.get_scale() < before
            self.epoch += 1
            self.save()
        return skipped


if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    r = Runner(1)
    r.train(3)
    print(f"first job: loss scale {r.scaler.get_scale():.0f} at its end")
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", work], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
r = Runner(0)
r.resume()
restored = r.scaler.get_scale()
skipped = r.train(3)
print(f"resumed at epoch 3 with the checkpoint's loss scale {restored:.0f}; the continued run started at 65536 and "
      f"skipped {skipped} steps on overflow")

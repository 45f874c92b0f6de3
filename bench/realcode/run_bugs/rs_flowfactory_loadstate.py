# Source: https://github.com/X-GenGroup/Flow-Factory/issues/172 (fixed by X-GenGroup/Flow-Factory#174: "defer 'state'
#   checkpoint resume until after accelerator.prepare()")
# Original: X-GenGroup/Flow-Factory BaseAdapter.__init__ -> load_checkpoint(resume_type='state') ->
#   accelerator.load_state(), and the trainer's _initialization() that builds the optimizer and calls
#   accelerator.prepare() afterwards (from the issue and the PR's description)
# Bug: accelerator.load_state() restores only the models, optimizers and schedulers already registered through
# accelerator.prepare(); the adapter calls it in its constructor, before the trainer prepared anything, so the resume
# restores nothing but the RNG state, silently: the weights start from their initialisation and the AdamW moments
# from zero, while the run goes on writing checkpoint-N folders from the step it believes it resumed at.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator

save_dir = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()


class Config:
    lr = 5e-4
    save_steps = 8
    resume_type = "state"

    def __init__(self, resume_path=None, resume_step=0):
        self.resume_path = resume_path
        self.resume_step = resume_step


class BaseAdapter:
    def __init__(self, config, accelerator):
        self.config = config
        self.accelerator = accelerator
        torch.manual_seed(0)
        self.transformer = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        if config.resume_path and config.resume_type == "state":
            self.load_checkpoint(config.resume_path)

    def load_checkpoint(self, path):
        self.accelerator.load_state(path)  # BUG

    def save_checkpoint(self, path):
        self.accelerator.save_state(path)


class Trainer:
    def __init__(self, config):
        self.config = config
        self.accelerator = Accelerator(cpu=True)
        self.adapter = BaseAdapter(config, self.accelerator)
        self._initialization()
        self.g = torch.Generator().manual_seed(3)

    def _initialization(self):
        self.optimizer = torch.optim.AdamW(self.adapter.transformer.parameters(), lr=self.config.lr)
        self.adapter.transformer, self.optimizer = self.accelerator.prepare(self.adapter.transformer, self.optimizer)

    def train(self, steps):
        self.adapter.transformer.train()
        losses = []
        for step in range(self.config.resume_step, self.config.resume_step + steps):
            x = torch.randn(16, 32, generator=self.g)
            loss = F.mse_loss(self.adapter.transformer(x), torch.tanh(x.flip(-1)))
            self.optimizer.zero_grad()
            self.accelerator.backward(loss)
            self.optimizer.step()
            losses.append(loss.item())
            if (step + 1) % self.config.save_steps == 0:
                self.adapter.save_checkpoint(os.path.join(save_dir, f"checkpoint-{step + 1}"))
        return losses


if len(sys.argv) > 1 and sys.argv[1] == "--first-job":
    print(f"first job's last loss {Trainer(Config()).train(24)[-1]:.3f}")
    sys.exit(0)

subprocess.run([sys.executable, __file__, "--first-job", save_dir], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
trainer = Trainer(Config(resume_path=os.path.join(save_dir, "checkpoint-24"), resume_step=24))
held = len(trainer.optimizer.optimizer.state)
losses = trainer.train(16)
print(f"'resumed' at step 24: first loss {losses[0]:.3f} (a fresh model's, not the trained one's); the AdamW state "
      f"held {held} entries before its first step")

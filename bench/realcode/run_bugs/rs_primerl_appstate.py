# Source: https://github.com/PrimeIntellect-ai/prime-rl/pull/1311 (commit a2a74cd)
# Original: PrimeIntellect-ai/prime-rl src/prime_rl/trainer/ckpt.py (AppState.state_dict, load_state_dict),
# read at a2a74cd^
# Bug: AppState saves the optimizers' state with get_state_dict(model, optimizers), but its load_state_dict calls
# set_state_dict(self.model, [], ...): an empty optimizer list, so the saved optimizer state is never applied. A
# resumed trainer gets its weights back while AdamW's moments and step counts start from zero. torch.distributed
# .checkpoint's save/load of the AppState is replaced by torch.save/torch.load of the same dicts.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

torch.manual_seed(0)


class AppState:
    def __init__(self, model, optimizers, scheduler=None, progress=None):
        self.model, self.optimizers, self.scheduler, self.progress = model, optimizers, scheduler, progress

    def state_dict(self):
        model_state_dict, optimizer_state_dict = get_state_dict(self.model, self.optimizers)
        state_dict = {"model": model_state_dict, "optimizers": optimizer_state_dict}
        if self.scheduler is not None:
            state_dict["scheduler"] = self.scheduler.state_dict()
        if self.progress is not None:
            state_dict["progress"] = dict(self.progress)
        return state_dict

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, [], model_state_dict=state_dict["model"], optim_state_dict=state_dict["optimizers"])  # BUG
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])
        if self.progress is not None:
            self.progress.update(state_dict["progress"])


class CheckpointManager:
    def __init__(self, root):
        self.root = root

    def save(self, app_state, step):
        torch.save(app_state.state_dict(), os.path.join(self.root, f"step_{step}.pt"))

    def load(self, app_state, step):
        app_state.load_state_dict(torch.load(os.path.join(self.root, f"step_{step}.pt"), weights_only=False))


def setup():
    model = torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.GELU(), torch.nn.Linear(96, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, progress, steps):
    for _ in range(steps):
        x = torch.randn(32, 32)
        loss = F.cross_entropy(model(x), x[:, :10].argmax(1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        progress["step"] += 1
    return loss.item()


root = tempfile.mkdtemp()
if len(sys.argv) > 1 and sys.argv[1] == "first-job":  # the run before the restart (its own process)
    model, optimizer, scheduler = setup()
    progress = {"step": 0}
    print("first job", round(train(model, optimizer, scheduler, progress, 40), 4))
    CheckpointManager(sys.argv[2]).save(AppState(model, [optimizer], scheduler, progress), 40)
    sys.exit(0)
subprocess.run([sys.executable, __file__, "first-job", root], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
model, optimizer, scheduler = setup()
progress = {"step": 0}
CheckpointManager(root).load(AppState(model, [optimizer], scheduler, progress), 40)
print("resumed at step", progress["step"], "optimizer state entries", len(optimizer.state))
print("resumed job", round(train(model, optimizer, scheduler, progress, 40), 4))

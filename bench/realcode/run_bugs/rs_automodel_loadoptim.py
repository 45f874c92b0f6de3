# Source: https://github.com/NVIDIA-NeMo/Automodel/issues/763
# Original: NVIDIA-NeMo/Automodel nemo_automodel/components/checkpoint/checkpointing.py (Checkpointer.load_optimizer)
# Bug: after a refactor the checkpointer reads the optimizer's saved state on resume but never hands it to the
# optimizer (the load_state_dict call went missing): the weights resume, Adam's moments and step counts restart.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Checkpointer:
    def __init__(self, root):
        self.root = root

    def save(self, step, model, optimizer):
        path = os.path.join(self.root, f"step_{step}")
        os.makedirs(path, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(path, "model.pt"))
        torch.save(optimizer.state_dict(), os.path.join(path, "optim.pt"))
        return path

    def load_model(self, model, path):
        model.load_state_dict(torch.load(os.path.join(path, "model.pt")))

    def load_optimizer(self, optimizer, path):
        state_dict = torch.load(os.path.join(path, "optim.pt"))  # BUG
        return state_dict


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))


def train(model, optimizer, steps):
    for _ in range(steps):
        x = torch.randn(16, 24)
        loss = F.cross_entropy(model(x), x[:, :8].argmax(1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


root = tempfile.mkdtemp()
if len(sys.argv) > 1 and sys.argv[1] == "first-job":  # the earlier job (its own process): trains, checkpoints
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    print("first job", round(train(model, optimizer, 30), 4))
    Checkpointer(sys.argv[2]).save(30, model, optimizer)
    sys.exit(0)
subprocess.run([sys.executable, __file__, "first-job", root], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
# the resumed job: a fresh model and optimizer, restored from the checkpoint
checkpointer = Checkpointer(root)
path = os.path.join(root, "step_30")
model = make_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
checkpointer.load_model(model, path)
checkpointer.load_optimizer(optimizer, path)
print("resumed job", round(train(model, optimizer, 30), 4))

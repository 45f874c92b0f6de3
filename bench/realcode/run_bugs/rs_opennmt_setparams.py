# Source: https://github.com/OpenNMT/OpenNMT-py/issues/617 (also https://github.com/OpenNMT/OpenNMT-py/issues/38)
# Original: OpenNMT/OpenNMT-py train.py (build_optim) and onmt/Optim.py (Optim.set_parameters)
# Bug: on --train_from the optimizer (with its state) is restored from the checkpoint, then
# optim.set_parameters(model.parameters()) is called unconditionally and builds a new torch optimizer,
# erasing the loaded Adam state.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Optim:
    def __init__(self, method, lr, max_grad_norm):
        self.method, self.lr, self.max_grad_norm = method, lr, max_grad_norm
        self.optimizer = None

    def set_parameters(self, params):
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = torch.optim.Adam(self.params, lr=self.lr, betas=(0.9, 0.98))

    def step(self):
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()


def make_model():
    return torch.nn.Sequential(torch.nn.Embedding(40, 16), torch.nn.Linear(16, 40))


ckpt = os.path.join(tempfile.mkdtemp(), "model_step_100.pt")
# The earlier run's checkpoint: model weights and the optimizer's state dict (a separate process).
subprocess.run([sys.executable, "-c", (
    "import torch\n"
    "m = torch.nn.Sequential(torch.nn.Embedding(40, 16), torch.nn.Linear(16, 40))\n"
    "o = torch.optim.Adam(m.parameters(), lr=1e-3, betas=(0.9, 0.98))\n"
    "m(torch.randint(0, 40, (4, 6))).sum().backward(); o.step()\n"
    f"torch.save({{'model': m.state_dict(), 'optim': o.state_dict()}}, {ckpt!r})\n")],
    check=True, env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})


def build_optim(model, checkpoint):
    optim = Optim("adam", 1e-3, 5)
    if checkpoint is not None:
        optim.set_parameters(model.parameters())
        optim.optimizer.load_state_dict(checkpoint["optim"])
    optim.set_parameters(model.parameters())  # BUG
    return optim


checkpoint = torch.load(ckpt)
model = make_model()
model.load_state_dict(checkpoint["model"])
optim = build_optim(model, checkpoint)
for step in range(30):
    src = torch.randint(0, 40, (8, 6))
    model.zero_grad()
    loss = F.cross_entropy(model(src[:, :-1]).reshape(-1, 40), src[:, 1:].reshape(-1))
    loss.backward()
    optim.step()
print("done")

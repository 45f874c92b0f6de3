# Source: https://github.com/CodefyUI/CodefyUI/pull/147
# Original: CodefyUI/CodefyUI backend training nodes (TrainingLoop: the optimizer it receives is rebuilt)
# Bug: the training-loop node rebuilds the optimizer it is given from its class and defaults on every run, so a
# resume that loaded the optimizer's state dict restores only the weights; Adam's moments and steps start over.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


ckpt = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")
# The earlier run's checkpoint (a separate process): weights and the Adam state after some steps.
subprocess.run([sys.executable, "-c", (
    "import torch\n"
    "torch.manual_seed(1)\n"
    "m = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))\n"
    "o = torch.optim.Adam(m.parameters(), lr=1e-3)\n"
    "for _ in range(5):\n"
    "    o.zero_grad(); m(torch.randn(16, 12)).pow(2).mean().backward(); o.step()\n"
    f"torch.save({{'model_state_dict': m.state_dict(), 'optimizer_state_dict': o.state_dict(), 'epoch': 5}}, {ckpt!r})\n")],
    check=True, env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})


class TrainingLoop:
    def execute(self, model, optimizer, batches, epochs, start_epoch=0):
        optimizer_cls, defaults = type(optimizer), dict(optimizer.defaults)
        optimizer = optimizer_cls(model.parameters(), **defaults)  # BUG
        history = []
        for epoch in range(start_epoch, start_epoch + epochs):
            model.train()
            for x, y in batches:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
            history.append(loss.item())
        return model, optimizer, history


checkpoint = torch.load(ckpt)
model = make_model()
model.load_state_dict(checkpoint["model_state_dict"])
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
batches = [(torch.randn(16, 12), torch.randint(0, 3, (16,))) for _ in range(10)]
model, optimizer, history = TrainingLoop().execute(model, optimizer, batches, epochs=4, start_epoch=checkpoint["epoch"])
print("losses", [round(v, 4) for v in history])

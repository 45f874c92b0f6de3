# Source: synthetic: state 4 of run14 (a load_state_dict of the model's own, not nn.Module's)
# Original: our own; a model class whose load_state_dict copies tensors by name and never calls nn.Module's
# Bug: the resume reads the full checkpoint ({'epoch', 'model', 'optimizer'}) and restores the weights through the
# model's own load_state_dict; the optimizer's entry is left in the file, so the resumed SGD's momentum starts at zero.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    def load_state_dict(self, state, strict=True):
        own = self.state_dict()
        with torch.no_grad():
            for name, value in state.items():
                if name in own:
                    own[name].copy_(value)


def train(model, optimizer, epochs, start=0):
    for _ in range(start, epochs):
        for _ in range(8):
            x = torch.randn(16, 8)
            optimizer.zero_grad()
            F.cross_entropy(model(x), x[:, :4].argmax(1)).backward()
            optimizer.step()


torch.manual_seed(0)
model = TinyNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
if len(sys.argv) > 2 and sys.argv[1] == "--first":
    train(model, optimizer, 3)
    torch.save({"epoch": 3, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, sys.argv[2])
    sys.exit(0)

path = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")
env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
subprocess.run([sys.executable, __file__, "--first", path], check=True, env=env)
checkpoint = torch.load(path)
model.load_state_dict(checkpoint["model"])  # BUG
train(model, optimizer, 6, start=checkpoint["epoch"])
print("resumed, momentum buffers:", len(optimizer.state))

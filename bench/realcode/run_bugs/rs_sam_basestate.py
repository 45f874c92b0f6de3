# Source: https://github.com/davda54/sam/pull/39 (issue #34)
# Original: davda54/sam sam.py (SAM) and example/train.py
# Bug: SAM wraps a base optimizer but its state_dict()/load_state_dict() are torch.optim.Optimizer's own:
# resuming loads the checkpoint into the wrapper, while the base optimizer that really steps keeps an
# empty state (its momentum buffers restart) and no longer shares the loaded param_groups.
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F


class SAM(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        grad_norm = torch.norm(torch.stack([p.grad.norm(2) for g in self.param_groups for p in g["params"]
                                            if p.grad is not None]), 2)
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                self.state[p]["old_p"] = p.data.clone()
                p.add_(p.grad * scale)
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data = self.state[p]["old_p"]
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))


def train(model, optimizer, steps):
    for step in range(steps):
        x, y = torch.randn(16, 20), torch.randint(0, 5, (16,))
        F.cross_entropy(model(x), y).backward()
        optimizer.first_step(zero_grad=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.second_step(zero_grad=True)


if len(sys.argv) > 2 and sys.argv[1] == "--save":
    # the earlier run: train, then checkpoint the model and the optimizer
    model = make_model()
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    train(model, optimizer, 5)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, sys.argv[2])
    sys.exit(0)

path = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")
subprocess.run([sys.executable, __file__, "--save", path], check=True,
               env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})
model = make_model()
optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
checkpoint = torch.load(path)
model.load_state_dict(checkpoint["model"])
optimizer.load_state_dict(checkpoint["optimizer"])  # BUG
train(model, optimizer, 30)
print("done")

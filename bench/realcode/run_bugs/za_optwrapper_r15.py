# Source: synthetic: run15 line shape (zero_grad through the project's optimizer wrapper class)
# Bug: the project wraps its optimizer in a small class (warm-up of the learning rate in step(), zero_grad()
# passed through); the accumulation loop calls the wrapper's zero_grad() before every micro-batch's backward,
# so each optimizer step applies the last micro-batch only. The line to change is the zero_grad() call in the
# loop, not the pass-through inside the wrapper. `healthy` clears after the step, once per window.
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
HEALTHY = "healthy" in sys.argv[1:]


class WarmupOptimizer:
    def __init__(self, optimizer, warmup, base_lr):
        self.optimizer = optimizer
        self.warmup = warmup
        self.base_lr = base_lr
        self.n = 0

    def step(self):
        self.n += 1
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * min(1.0, self.n / self.warmup)
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad()


model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1))
optim = WarmupOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), warmup=5, base_lr=1e-3)
accum = 4
batches = [(torch.randn(8, 16), torch.randn(8, 1)) for _ in range(48)]
for i, (x, y) in enumerate(batches):
    if not HEALTHY:
        optim.zero_grad()  # BUG
    loss = nn.functional.mse_loss(model(x), y) / accum
    loss.backward()
    if (i + 1) % accum == 0:
        optim.step()
        if HEALTHY:
            optim.zero_grad()
print("done")

# Source: synthetic: run15 line shape (a StepLR sized in epochs, stepped per batch through a wrapper)
# Bug: the scheduler (StepLR, step_size in epochs) is held by a small wrapper that also logs the learning rate;
# the batch loop calls the wrapper's step() after every optimizer step instead of once per epoch, so the
# learning rate is cut by gamma every 3 batches and is near zero after one epoch. The line to change is the
# step() call in the batch loop. `healthy` steps it once per epoch.
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
HEALTHY = "healthy" in sys.argv[1:]


class LoggedScheduler:
    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.history = []

    def step(self):
        self.scheduler.step()
        self.history.append(self.scheduler.get_last_lr()[0])


model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
epochs = 6
sched = LoggedScheduler(torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.1))
batches = [(torch.randn(16, 10), torch.randn(16, 1)) for _ in range(20)]
for epoch in range(epochs):
    for x, y in batches:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if not HEALTHY:
            sched.step()  # BUG
    if HEALTHY:
        sched.step()
    print(f"epoch {epoch} loss {loss.item():.4f} lr {opt.param_groups[0]['lr']:.2e}")
print("done")

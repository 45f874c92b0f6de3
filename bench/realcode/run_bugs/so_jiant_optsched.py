# Source: https://github.com/jiant-dev/jiant-dev/pull/89
# Original: jiant-dev/jiant-dev jiant/shared/model_setup.py (OptimizerScheduler.step)
# Bug: OptimizerScheduler.step() steps the LR scheduler before optimizer.step(), skipping the first value
# of the warm-up schedule.
import torch

torch.manual_seed(0)


class OptimizerScheduler:
    def __init__(self, optimizer, scheduler):
        self.optimizer = optimizer
        self.scheduler = scheduler

    def step(self):
        self.scheduler.step()  # BUG
        self.optimizer.step()


model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
t_total, warmup = 40, 4
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: s / warmup if s < warmup else max(0.0, (t_total - s) / (t_total - warmup)))
optimizer_scheduler = OptimizerScheduler(optimizer, scheduler)
for step in range(t_total):
    x, y = torch.randn(16, 32), torch.randint(0, 3, (16,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer_scheduler.step()
    model.zero_grad()
print("done")

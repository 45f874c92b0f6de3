# Source: https://github.com/ScrollPrize/villa/pull/1495
# Original: ScrollPrize/villa (the training manager's _get_scheduler and its train.py loop)
# Bug: the per-iteration schedulers (onecycle, cyclic, cosine warm-up) are built with max_steps=max_epoch,
# an epoch count, but stepped once per optimizer step: the horizon is short by the steps of an epoch.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Mgr:
    max_epoch = 6
    max_steps_per_epoch = 10
    initial_lr = 1e-3


def _get_scheduler(mgr, optimizer, name="onecycle"):
    if name == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=mgr.initial_lr,
                                                   total_steps=mgr.max_epoch)  # BUG
    raise ValueError(name)


mgr = Mgr()
model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 1, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=mgr.initial_lr)
scheduler = _get_scheduler(mgr, optimizer)
for epoch in range(mgr.max_epoch):
    for i in range(mgr.max_steps_per_epoch):
        x = torch.randn(2, 1, 16, 16)
        loss = F.mse_loss(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
print("done")

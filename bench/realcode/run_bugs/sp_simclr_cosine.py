# Source: https://github.com/sthalles/SimCLR/issues/8
# Original: sthalles/SimCLR simclr.py (SimCLR.train, the 2020 version)
# Bug: CosineAnnealingLR is built with T_max=len(train_loader), a number of batches, but scheduler.step()
# runs once per epoch (after a 10-epoch warm-up), so the cosine advances a few of its T_max steps over the
# whole run and the learning rate hardly decays.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
optimizer = torch.optim.Adam(model.parameters(), 3e-4, weight_decay=1e-6)
train_loader = [(torch.randn(16, 24), torch.randn(16, 24)) for _ in range(20)]
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(train_loader), eta_min=0,
                                                       last_epoch=-1)


def nt_xent(zis, zjs, temperature=0.5):
    z = F.normalize(torch.cat([zis, zjs]), dim=1)
    sim = z @ z.t() / temperature
    sim.fill_diagonal_(float("-inf"))
    n = zis.size(0)
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, targets)


n_iter = 0
for epoch_counter in range(14):
    for xis, xjs in train_loader:
        optimizer.zero_grad()
        loss = nt_xent(model(xis), model(xjs))
        loss.backward()
        optimizer.step()
        n_iter += 1
    # warm-up for the first 10 epochs
    if epoch_counter >= 10:
        scheduler.step()  # BUG
print("done", scheduler.get_last_lr())

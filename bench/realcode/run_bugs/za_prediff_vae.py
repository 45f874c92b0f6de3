# Source: https://github.com/gaozhihan/PreDiff/issues/32
# Original: gaozhihan/PreDiff scripts/vae/sevirlr/train_vae_sevirlr.py (training_step, manual optimization)
# Bug: g_opt.zero_grad() runs every micro-batch although the optimizer steps only every
# accumulate_grad_batches, so all but the last micro-batch's gradients are erased.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
accumulate_grad_batches = 4
vae = torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.ReLU(), torch.nn.Linear(8, 32))
g_opt = torch.optim.Adam(vae.parameters(), lr=1e-3)


def training_step(batch, batch_idx):
    g_opt.zero_grad()  # BUG
    rec = vae(batch)
    loss = F.mse_loss(rec, batch) / accumulate_grad_batches
    loss.backward()
    if (batch_idx + 1) % accumulate_grad_batches == 0:
        g_opt.step()
    return loss


for batch_idx in range(80):
    training_step(torch.randn(8, 32), batch_idx)
print("done")

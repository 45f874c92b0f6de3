# Source: https://github.com/lucidrains/ema-pytorch/issues/9
# Original: lucidrains/ema-pytorch ema_pytorch/ema_pytorch.py (EMA.update with update_model_with_ema_every), used
# in a DDP training loop as the answer suggests (EMA kept on rank 0 only)
# Bug: the EMA wrapper is updated only on rank 0, and with update_model_with_ema_every it copies the EMA weights
# back into the online model; DDP broadcasts parameters only at construction, so from that step on rank 0 trains
# other weights than rank 1 (as the follow-up comments point out).
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class EMA(torch.nn.Module):
    def __init__(self, model, beta=0.99, update_after_step=10, update_every=5, update_model_with_ema_every=20):
        super().__init__()
        self.online_model = [model]
        self.ema_model = copy.deepcopy(model).requires_grad_(False)
        self.beta, self.update_after_step, self.update_every = beta, update_after_step, update_every
        self.update_model_with_ema_every = update_model_with_ema_every
        self.step = 0

    @torch.no_grad()
    def update(self):
        self.step += 1
        model = self.online_model[0]
        if self.step <= self.update_after_step:
            self.ema_model.load_state_dict(model.state_dict())
            return
        if self.step % self.update_every == 0:
            for ema_p, p in zip(self.ema_model.parameters(), model.parameters()):
                ema_p.lerp_(p, 1 - self.beta)
        if self.update_model_with_ema_every and self.step % self.update_model_with_ema_every == 0:
            for ema_p, p in zip(self.ema_model.parameters(), model.parameters()):
                p.copy_(ema_p)


net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.SiLU(), torch.nn.Linear(64, 16))
model = DDP(net)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
ema = EMA(net) if rank == 0 else None
g = torch.Generator().manual_seed(1 + rank)
for step in range(60):
    x = torch.randn(32, 16, generator=g)
    loss = F.mse_loss(model(x), x.flip(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        ema.update()  # BUG
print("rank", rank, "loss", loss.item())
dist.barrier()
dist.destroy_process_group()

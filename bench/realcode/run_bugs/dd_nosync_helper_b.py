# Source: synthetic: run15 line shape
# Original: none: gradient accumulation whose DDP sync context is chosen by a helper; the helper's bound is off by
# one (it compares with the number of micro-batches plus one); synthetic regression data, 2 ranks (gloo)
# Bug: every micro-batch, the last one included, runs under `no_sync()`, so no all-reduce ever happens and each
# rank steps on its own accumulated gradient: the replicas drift apart.
import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def grad_sync_context(model, micro_step, micro_steps):
    if micro_step <= micro_steps:
        return model.no_sync()  # BUG
    return contextlib.nullcontext()


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)
accum = 4
for step in range(10):
    optimizer.zero_grad()
    for micro in range(1, accum + 1):
        x = torch.randn(16, 10, generator=g)
        with grad_sync_context(model, micro, accum):
            loss = F.mse_loss(model(x), x[:, :1] * 2 - x[:, 1:2]) / accum
            loss.backward()
    optimizer.step()
weight = net[2].weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weight)
if rank == 0:
    print("max |rank0 - rank1|", (gathered[0] - gathered[1]).abs().max().item())
dist.destroy_process_group()

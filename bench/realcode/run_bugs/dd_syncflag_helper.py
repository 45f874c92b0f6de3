# Source: synthetic: run15 line shape
# Original: none: gradient accumulation that sets DDP's `require_backward_grad_sync` flag in a helper called before
# each micro-batch; the micro-batches are counted from 0 but the helper compares with their number; synthetic
# regression data, 2 ranks (gloo)
# Bug: `micro == accum` is never true for micro in range(accum): the last micro-batch also runs with the flag off,
# no all-reduce ever happens, and each rank steps on its own gradient.
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def set_grad_sync(model, micro, accum):
    model.require_backward_grad_sync = micro == accum  # BUG


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
    for micro in range(accum):
        x = torch.randn(16, 10, generator=g)
        set_grad_sync(model, micro, accum)
        loss = F.mse_loss(model(x), x[:, :1] * 2 - x[:, 1:2]) / accum
        loss.backward()
    optimizer.step()
weight = net[2].weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weight)
if rank == 0:
    print("max |rank0 - rank1|", (gathered[0] - gathered[1]).abs().max().item())
dist.destroy_process_group()

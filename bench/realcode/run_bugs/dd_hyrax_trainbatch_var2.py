# Source: https://github.com/lincc-frameworks/hyrax/pull/1008 (variant of dd_hyrax_trainbatch, written by run13c)
# Original: none (a variant): the same family in another shape, the entry script wraps the model in DDP and hands a
# model to train_one_epoch(m, loader, o) defined in another module of a small package (ddvar_pkg); synthetic data
# Bug: the script passes the unwrapped module (kept in `net` from before the wrapping) instead of the DDP wrapper, so
# every forward of the epoch function bypasses DDP: no gradient is all-reduced and the ranks train apart.
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddvar_pkg.train_utils import train_one_epoch

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
ddp = DDP(net)
o = torch.optim.Adam(ddp.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(10 + rank)
for epoch in range(3):
    loader = [(x, (x[:, :4].argmax(1))) for x in torch.randn(10, 16, 12, generator=g)]
    last = train_one_epoch(net, loader, o)  # BUG
weight = net[2].weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weight)
if rank == 0:
    print("loss", round(last, 4), "max |rank0 - rank1|", (gathered[0] - gathered[1]).abs().max().item())
dist.destroy_process_group()

# Source: synthetic: run15 line shape
# Original: none: the script counts the wrapped model's parameters through `model.module` right after wrapping (a
# harmless read), and its step helper later calls `model.module(x)`; synthetic regression data, 2 ranks (gloo)
# Bug: the training forward goes around the DDP wrapper, so DDP's reducer never all-reduces a gradient and each
# rank steps on its own: the replicas drift apart.
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
model = DDP(net)
n_params = sum(p.numel() for p in model.module.parameters())
if rank == 0:
    print("parameters", n_params)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)


def train_step(x, y):
    out = model.module(x)  # BUG
    loss = F.mse_loss(out, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


for step in range(30):
    x = torch.randn(16, 10, generator=g)
    train_step(x, x[:, :1] * 2 - x[:, 1:2])
weight = net[2].weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weight)
if rank == 0:
    print("max |rank0 - rank1|", (gathered[0] - gathered[1]).abs().max().item())
dist.destroy_process_group()

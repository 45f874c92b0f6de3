# Source: synthetic: run15 line shape
# Original: none: a decoupled weight decay written by hand through `p.data` in a training helper, under the
# main-process branch that also prints; synthetic regression data, 2 ranks (gloo)
# Bug: DDP averages gradients only; the decay through `.data` runs on rank 0 alone, so rank 0 shrinks its weights
# every step and rank 1 never does: the replicas drift apart.
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def train_epoch(model, optimizer, gen, rank, steps=10, decay=1e-3):
    for i in range(steps):
        x = torch.randn(16, 10, generator=gen)
        loss = F.mse_loss(model(x), x[:, :1] * 2 - x[:, 1:2])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            for p in model.parameters():
                p.data.mul_(1 - decay)  # BUG
            if i == steps - 1:
                print("loss", round(loss.item(), 4))


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)
for epoch in range(3):
    train_epoch(model, optimizer, g, rank)
weight = net[2].weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weight)
if rank == 0:
    print("max |rank0 - rank1|", (gathered[0] - gathered[1]).abs().max().item())
dist.destroy_process_group()

# Source: https://github.com/lincc-frameworks/hyrax/pull/1008 (variant of dd_hyrax_trainbatch, written by run13c)
# Original: none (a variant): the same family in another shape, a trainer class holding self.model (the DDP wrapper)
# and self.optimizer, with a rank-dependent branch in its step method; synthetic regression data
# Bug: gradient clipping sits under the "main process" branch that also guards the logging; DDP has averaged the
# gradients, but only rank 0 clips them, so the ranks apply different updates and the replicas drift apart.
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, rank, max_norm=0.05):
        self.rank = rank
        self.is_main = rank == 0
        self.model = DDP(model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.max_norm = max_norm

    def step(self, x, y):
        loss = F.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        if self.is_main:
            grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)  # BUG
            self.last_norm = grad_norm.item()
        self.optimizer.step()
        return loss.item()


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
trainer = Trainer(net, rank)
g = torch.Generator().manual_seed(rank)
for epoch in range(3):
    for i in range(10):
        x = torch.randn(16, 10, generator=g)
        loss = trainer.step(x, x[:, :1] * 2 - x[:, 1:2])
weight = net[2].weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weight)
if rank == 0:
    print("loss", round(loss, 4), "max |rank0 - rank1|", (gathered[0] - gathered[1]).abs().max().item())
dist.destroy_process_group()

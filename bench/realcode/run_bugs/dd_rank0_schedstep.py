# Source: synthetic: run15 line shape
# Original: none: a trainer class whose step method logs and steps the learning-rate scheduler under the same
# main-process branch; synthetic regression data, 2 ranks (gloo)
# Bug: only rank 0 steps the StepLR, so its learning rate halves every 5 steps while rank 1 keeps the first one;
# the gradients are the same after the all-reduce, the updates are not: the replicas drift apart.
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, rank):
        self.model = DDP(model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=5, gamma=0.5)
        self.is_main = rank == 0
        self.step_no = 0

    def train_step(self, x, y):
        loss = F.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.step_no += 1
        if self.is_main:
            if self.step_no % 10 == 0:
                print("step", self.step_no, "loss", round(loss.item(), 4), "lr", self.scheduler.get_last_lr()[0])
            self.scheduler.step()  # BUG
        return loss


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
trainer = Trainer(net, rank)
g = torch.Generator().manual_seed(rank)
for i in range(30):
    x = torch.randn(16, 10, generator=g)
    trainer.train_step(x, x[:, :1] * 2 - x[:, 1:2])
weight = net[2].weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weight)
if rank == 0:
    print("max |rank0 - rank1|", (gathered[0] - gathered[1]).abs().max().item())
dist.destroy_process_group()

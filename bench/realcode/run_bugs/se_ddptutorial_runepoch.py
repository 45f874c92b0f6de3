# Source: https://github.com/pytorch/examples/commit/2ee8d43dbe420be152fd5ce0d80b43b419a0e352
# Original: pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py (Trainer._run_epoch)
# Bug: the DataLoader uses a DistributedSampler but _run_epoch never calls sampler.set_epoch(epoch).
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, model, train_data, optimizer):
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        for source, targets in self.train_data:  # BUG
            self._run_batch(source, targets)

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)


dist.init_process_group("gloo")
torch.manual_seed(0)
train_set = TensorDataset(torch.randn(64, 20), torch.randint(0, 2, (64,)))
train_data = DataLoader(train_set, batch_size=8, pin_memory=True, shuffle=False, sampler=DistributedSampler(train_set))
model = torch.nn.Linear(20, 2)
Trainer(model, train_data, torch.optim.SGD(model.parameters(), lr=1e-3)).train(4)
dist.destroy_process_group()

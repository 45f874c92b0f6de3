# Source: https://github.com/pytorch/examples/commit/2ee8d43dbe420be152fd5ce0d80b43b419a0e352
# Original: pytorch/examples distributed/minGPT-ddp/mingpt/trainer.py (Trainer._run_epoch)
# Bug: the trainer builds its loaders with a DistributedSampler but _run_epoch never calls
# sampler.set_epoch(epoch).
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

vocab = 40


class Trainer:
    def __init__(self, model, optimizer, train_dataset, test_dataset=None):
        self.model = DDP(model)
        self.optimizer = optimizer
        self.train_loader = self._prepare_dataloader(train_dataset)
        self.epochs_run = 0

    def _prepare_dataloader(self, dataset):
        return DataLoader(dataset, batch_size=8, pin_memory=True, shuffle=False, num_workers=0,
                          sampler=DistributedSampler(dataset))

    def _run_batch(self, source, targets, train=True):
        with torch.set_grad_enabled(train):
            logits = self.model(source)
            loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        if train:
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch, dataloader, train=True):
        for iter, (source, targets) in enumerate(dataloader):  # BUG
            self._run_batch(source, targets, train)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch, self.train_loader, train=True)


dist.init_process_group("gloo")
torch.manual_seed(0)
seqs = torch.randint(0, vocab, (64, 9))
train_dataset = TensorDataset(seqs[:, :-1], seqs[:, 1:])
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab))
Trainer(model, torch.optim.AdamW(model.parameters(), lr=3e-4), train_dataset).train(4)
dist.destroy_process_group()

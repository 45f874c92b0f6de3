# Source: https://github.com/NCAR/miles-credit/pull/153
# Original: NCAR/miles-credit credit/trainers/ (the trainer classes) and credit/distributed.py
# Bug: the trainer strips the DDP wrapper off the model before training, so the ranks train independent
# models that never share gradient updates (error spikes when the saved weights are reloaded).
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


def distributed_model_wrapper(conf, model):
    return DDP(model) if conf["trainer"]["mode"] == "ddp" else model


class Trainer:
    def __init__(self, model, rank):
        self.model = model.module if hasattr(model, "module") else model  # BUG
        self.rank = rank

    def train_one_epoch(self, epoch, optimizer, batches):
        self.model.train()
        for x, y in batches:
            y_pred = self.model(x)
            loss = F.mse_loss(y_pred, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


conf = {"trainer": {"mode": "ddp"}}
model = distributed_model_wrapper(conf, torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 12)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
trainer = Trainer(model, rank)
for epoch in range(3):
    batches = [(torch.randn(8, 12, generator=g), torch.randn(8, 12, generator=g)) for _ in range(10)]
    trainer.train_one_epoch(epoch, optimizer, batches)
dist.destroy_process_group()

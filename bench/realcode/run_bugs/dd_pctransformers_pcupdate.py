# Source: https://github.com/iCog-Labs-Dev/PC-Transformers/pull/135 (commit 49e9743, "manual PC weight
# synchronization in DDP")
# Original: iCog-Labs-Dev/PC-Transformers predictive_coding/pc_layer.py (PCLayer: inference steps, then a local
# weight update) and training.py (DDP-wrapped model, DistributedSampler); from the PR text, trimmed to one PC block
# Bug: each predictive-coding layer updates its own weights inside the forward with a local (Hebbian-style) rule,
# written straight into .data; DDP only all-reduces gradients, so these updates are computed from each rank's own
# shard and never averaged: the replicas drift apart from the first step. Run with torchrun, 2 processes (gloo).
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class PCLayer(nn.Module):
    def __init__(self, dim, T=4, local_lr=3e-2, inference_lr=0.1):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.T, self.local_lr, self.inference_lr = T, local_lr, inference_lr

    def forward(self, x):
        mu = self.linear(x)
        if self.training:
            with torch.no_grad():
                z = mu.detach().clone()
                for _ in range(self.T):
                    error = z - mu.detach()
                    z = z - self.inference_lr * (error - torch.tanh(z) * 0.5)
                error = (z - mu.detach()).flatten(0, 1)
                delta_w = error.t() @ x.detach().flatten(0, 1) / error.shape[0]
                self.linear.weight.data.add_(self.local_lr * delta_w)  # BUG
        return mu


class PCTransformer(nn.Module):
    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.attn_proj = PCLayer(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, dim))
        self.fc2 = PCLayer(dim)
        self.output = nn.Linear(dim, vocab)

    def forward(self, input_ids):
        h = self.embedding(input_ids)
        h = h + self.attn_proj(h)
        h = h + self.fc2(self.mlp(h))
        return self.output(h)


def train(model, loader, optimizer, epoch, rank):
    model.train()
    loader.sampler.set_epoch(epoch)
    for step, (input_ids, targets) in enumerate(loader):
        logits = model(input_ids)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (512, 17))
    dataset = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
    model = DDP(PCTransformer())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(2):
        train(model, loader, optimizer, epoch, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

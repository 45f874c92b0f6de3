# Source: https://github.com/deepvk/vitrina/pull/33
# Original: deepvk/vitrina src/utils/train.py (train(): the per-batch loop with save_every)
# Bug: every config.save_every batches the loop writes model.state_dict() alone, while it trains with AdamW and
# transformers' linear warm-up schedule stepped per batch: a run continued from batch_N.ckpt starts a fresh
# optimizer and restarts the warm-up; the PR saves {"scheduler", "model", "optimizer", "loss"} instead.
import os
import tempfile
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim import AdamW
from torch.utils.data import DataLoader, Dataset
from transformers import get_linear_schedule_with_warmup


@dataclass
class TrainingConfig:
    batch_size: int = 16
    epochs: int = 3
    lr: float = 5e-4
    beta1: float = 0.9
    beta2: float = 0.999
    warmup: int = 10
    log_every: int = 10
    save_every: int = 15
    random_state: int = 21


class ToxicDataset(Dataset):
    def __init__(self, n=320, max_len=24, vocab=200):
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(1, vocab, (n, max_len), generator=g)
        self.labels = (self.tokens[:, :4].sum(1) % 2).float()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.tokens[i], self.labels[i]

    @staticmethod
    def collate_function(items):
        return {"input_ids": torch.stack([t for t, _ in items]), "labels": torch.stack([y for _, y in items])}


class VisualTextClassifier(nn.Module):
    def __init__(self, vocab=200, dim=32):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))

    def forward(self, batch):
        return self.head(self.emb(batch["input_ids"])).squeeze(-1)


def dict_to_device(batch, device):
    return {k: v.to(device) for k, v in batch.items()}


def train(model: nn.Module, train_dataset: Dataset, criterion: nn.Module, config: TrainingConfig, save_dir: str):
    torch.manual_seed(config.random_state)
    device = "cpu"
    train_dataloader = DataLoader(train_dataset, batch_size=config.batch_size,
                                  collate_fn=train_dataset.collate_function, shuffle=True)
    model.to(device)
    optimizer = AdamW(model.parameters(), config.lr, betas=(config.beta1, config.beta2))
    num_training_steps = len(train_dataloader) * config.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=config.warmup,
                                                num_training_steps=num_training_steps)
    batch_num = 0
    for epoch in range(1, config.epochs + 1):
        for batch in train_dataloader:
            model.train()
            batch_num += 1
            batch = dict_to_device(batch, device=device)
            optimizer.zero_grad()
            prediction = model(batch)
            loss = criterion(prediction, batch["labels"].float())
            loss.backward()
            optimizer.step()
            scheduler.step()
            if batch_num % config.log_every == 0:
                print(f"Epoch {epoch} / {config.epochs} | Train loss: {round(loss.item(), 3)} "
                      f"| lr {scheduler.get_last_lr()[0]:.2e}")
            if batch_num % config.save_every == 0:
                torch.save(model.state_dict(), os.path.join(save_dir, f"batch_{batch_num}.ckpt"))  # BUG


if __name__ == "__main__":
    train(VisualTextClassifier(), ToxicDataset(), nn.BCEWithLogitsLoss(), TrainingConfig(), tempfile.mkdtemp())

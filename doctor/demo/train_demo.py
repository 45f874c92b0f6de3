"""A small training script with real, planted problems: torchdoctor's demo patient.

It trains a tiny classifier on synthetic data on the CPU in a few seconds.
Every problem below is a real one that users hit; `torchdoctor demo` finds
them by reading this file (`check`) and by running it (`run`).

Planted:
  1. the running loss is accumulated with its autograd graph (memory grows);
  2. validation runs with gradients enabled and dropout still active;
  3. a feature is standardised by a standard deviation that is zero for one
     batch, so the loss becomes NaN at a known step;
  4. OneCycleLR, a per-batch schedule, is stepped once per epoch;
  5. the checkpoint holds only the model weights, not the optimizer state,
     although --resume continues training from it.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self, features: int = 32, hidden: int = 64, classes: int = 4):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)


def make_data(n: int = 2048, features: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    x[384:416, 5] = 1.0  # a constant column inside one batch: its std is zero
    return TensorDataset(x, y)


def standardise(x):
    return (x - x.mean(dim=0)) / x.std(dim=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoint", default="demo_checkpoint.pt")
    parser.add_argument("--resume", action="store_true", help="continue training from --checkpoint")
    args = parser.parse_args()

    torch.manual_seed(0)
    train = DataLoader(make_data(), batch_size=32, shuffle=False)
    val = DataLoader(make_data(128, seed=1), batch_size=64)
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.epochs * len(train))
    criterion = nn.CrossEntropyLoss()
    if args.resume:
        model.load_state_dict(torch.load(args.checkpoint, map_location="cpu", weights_only=True))

    for epoch in range(args.epochs):
        model.train()
        total_loss = 0.0
        for x, y in train:
            optimizer.zero_grad()
            loss = criterion(model(standardise(x)), y)
            loss.backward()
            optimizer.step()
            total_loss += loss
        scheduler.step()

        correct = 0
        for x, y in val:
            logits = model(standardise(x))
            correct += (logits.argmax(dim=1) == y).sum().item()
        print(f"epoch {epoch}: loss {total_loss / len(train):.4f}, val accuracy {correct / 128:.2%}")

        torch.save(model.state_dict(), args.checkpoint)


if __name__ == "__main__":
    main()

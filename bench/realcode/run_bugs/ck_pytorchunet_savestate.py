# Source: https://github.com/milesial/Pytorch-UNet/issues/376
# Original: milesial/Pytorch-UNet train.py (train_model's per-epoch checkpoint, the --load option)
# Bug: the per-epoch checkpoint holds the model's state_dict (plus mask_values) only; the maintainer
# confirms that a run started with --load gets the weights back but a fresh RMSprop (no square averages,
# no momentum buffers), a fresh ReduceLROnPlateau and a fresh GradScaler.
import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class TinyUNet(torch.nn.Module):
    def __init__(self, n_channels=3, n_classes=2):
        super().__init__()
        self.inc = torch.nn.Sequential(torch.nn.Conv2d(n_channels, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
        self.down = torch.nn.Sequential(torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU())
        self.up = torch.nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.outc = torch.nn.Conv2d(16, n_classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        return self.outc(torch.cat([x1, self.up(self.down(x1))], dim=1))


def train_model(model, epochs, dir_checkpoint, learning_rate=1e-4, save_checkpoint=True):
    g = torch.Generator().manual_seed(epochs)
    images = torch.randn(48, 3, 16, 16, generator=g)
    masks = (images[:, 0] > 0).long()
    train_loader = DataLoader(TensorDataset(images, masks), batch_size=8, shuffle=True)
    mask_values = [0, 1]
    optimizer = torch.optim.RMSprop(model.parameters(), lr=learning_rate, weight_decay=1e-8, momentum=0.999)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, "max", patience=5)
    grad_scaler = torch.amp.GradScaler("cpu", enabled=False)
    for epoch in range(1, epochs + 1):
        model.train()
        epoch_loss = 0
        for x, y in train_loader:
            masks_pred = model(x)
            loss = F.cross_entropy(masks_pred, y)
            optimizer.zero_grad(set_to_none=True)
            grad_scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            grad_scaler.step(optimizer)
            grad_scaler.update()
            epoch_loss += loss.item()
        scheduler.step(-epoch_loss)
        print(f"epoch {epoch} loss {epoch_loss / len(train_loader):.4f}")
        if save_checkpoint:
            os.makedirs(dir_checkpoint, exist_ok=True)
            state_dict = model.state_dict()
            state_dict["mask_values"] = mask_values
            torch.save(state_dict, os.path.join(dir_checkpoint, f"checkpoint_epoch{epoch}.pth"))  # BUG


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--load", default=None)
    parser.add_argument("--checkpoints", default=tempfile.mkdtemp())
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = TinyUNet()
    if args.load:
        state_dict = torch.load(args.load, map_location="cpu")
        del state_dict["mask_values"]
        model.load_state_dict(state_dict)
        print(f"Model loaded from {args.load}")
    train_model(model, args.epochs, args.checkpoints)
    return args.checkpoints


if __name__ == "__main__":
    first = main(["--epochs", "3"])  # a first run, then a run continued from its last checkpoint
    main(["--epochs", "4", "--load", os.path.join(first, "checkpoint_epoch3.pth")])

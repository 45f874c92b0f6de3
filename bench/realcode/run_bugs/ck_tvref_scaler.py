# Source: https://github.com/pytorch/vision/pull/4923
# Original: pytorch/vision references/classification/train.py (main: the per-epoch checkpoint dict written with
#   utils.save_on_master; train_one_epoch with the GradScaler of --amp)
# Bug: with --amp the loop trains through a GradScaler, but the checkpoint written after every epoch holds the
# model, the optimizer, the lr_scheduler, the epoch and the args only: a run resumed with --resume starts the
# loss scale again from its default (65536) and its growth counter from 0; the PR adds "scaler".
import argparse
import os
import tempfile

import torch
import torch.nn as nn


def save_on_master(*args, **kwargs):
    torch.save(*args, **kwargs)


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args, scaler=None):
    model.train()
    for i, (image, target) in enumerate(data_loader):
        image, target = image.to(device), target.to(device)
        with torch.autocast("cpu", dtype=torch.float16, enabled=scaler is not None):
            output = model(image)
            loss = criterion(output, target)
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
    print(f"Epoch: [{epoch}] loss {loss.item():.4f} scale {scaler.get_scale() if scaler else 1.0}")


def main(args):
    torch.manual_seed(0)
    device = torch.device(args.device)
    data = [(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))) for _ in range(10)]
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10))
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scaler = torch.amp.GradScaler("cpu") if args.amp else None
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.lr_step_size, gamma=args.lr_gamma)
    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
        args.start_epoch = checkpoint["epoch"] + 1
    for epoch in range(args.start_epoch, args.epochs):
        train_one_epoch(model, criterion, optimizer, data, device, epoch, args, scaler)
        lr_scheduler.step()
        if args.output_dir:
            checkpoint = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "lr_scheduler": lr_scheduler.state_dict(),
                "epoch": epoch,
                "args": args,
            }
            save_on_master(checkpoint, os.path.join(args.output_dir, f"model_{epoch}.pth"))
            save_on_master(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))  # BUG


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Classification Training")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", default=4, type=int)
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--weight-decay", default=1e-4, type=float)
    parser.add_argument("--label-smoothing", default=0.0, type=float)
    parser.add_argument("--lr-step-size", default=2, type=int)
    parser.add_argument("--lr-gamma", default=0.1, type=float)
    parser.add_argument("--output-dir", default=tempfile.mkdtemp())
    parser.add_argument("--resume", default="")
    parser.add_argument("--start-epoch", default=0, type=int)
    parser.add_argument("--amp", action="store_true", default=True)
    return parser


if __name__ == "__main__":
    main(get_args_parser().parse_args())

# Source: https://github.com/IntelLabs/distiller/issues/145 (fixed in IntelLabs/distiller#182)
# Original: IntelLabs/distiller distiller/apputils/checkpoint.py (load_checkpoint, save_checkpoint) and
# examples/classifier_compression/compress_classifier.py (--resume)
# Bug: save_checkpoint stores the optimizer's state, but load_checkpoint restores only the model's weights
# (its optimizer argument is never used) and the script builds a fresh SGD afterwards: a resumed run
# continues from the saved epoch with empty momentum buffers and the initial learning rate.
import os
import subprocess
import sys
import tempfile

import torch

SAVER = """
import torch
model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                            torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
g = torch.Generator().manual_seed(1)
for _ in range(30):
    x, t = torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), t).backward(); opt.step()
for group in opt.param_groups:
    group["lr"] = 0.01
torch.save({{"epoch": 59, "arch": "simplenet", "state_dict": model.state_dict(), "best_top1": 61.0,
            "optimizer": opt.state_dict()}}, {path!r})
"""


def build():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def batches(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(n)]


def load_checkpoint(model, chkpt_file, optimizer=None):
    if not os.path.isfile(chkpt_file):
        raise OSError(f"Could not find a checkpoint file at {chkpt_file}")
    checkpoint = torch.load(chkpt_file, map_location="cpu")
    if "state_dict" not in checkpoint:
        raise ValueError("Checkpoint must contain the model parameters under the key 'state_dict'")
    checkpoint_epoch = checkpoint.get("epoch", None)
    start_epoch = checkpoint_epoch + 1 if checkpoint_epoch is not None else 0
    print(f"=> loaded checkpoint '{chkpt_file}' (epoch {checkpoint_epoch})")
    model.load_state_dict(checkpoint["state_dict"])  # BUG
    return model, None, start_epoch


def save_checkpoint(epoch, arch, model, optimizer, name, dir):
    checkpoint = {"epoch": epoch, "arch": arch, "state_dict": model.state_dict()}
    if optimizer is not None:
        checkpoint["optimizer"] = optimizer.state_dict()
    torch.save(checkpoint, os.path.join(dir, name))


def train(train_loader, model, criterion, optimizer, epoch):
    model.train()
    for inputs, target in train_loader:
        loss = criterion(model(inputs), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


if __name__ == "__main__":
    torch.manual_seed(0)
    logdir = tempfile.mkdtemp()
    resume = os.path.join(logdir, "checkpoint.pth.tar")
    subprocess.run([sys.executable, "-c", SAVER.format(path=resume)], check=True,
                   env={k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")})

    model = build()
    start_epoch = 0
    if resume:
        model, compression_scheduler, start_epoch = load_checkpoint(model, chkpt_file=resume)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    train_loader = batches(15, seed=2)
    for epoch in range(start_epoch, start_epoch + 3):
        loss = train(train_loader, model, criterion, optimizer, epoch)
        save_checkpoint(epoch, "simplenet", model, optimizer, "checkpoint.pth.tar", logdir)
        print("epoch", epoch, "loss", round(loss, 4))

"""Gradient-guided Modality Decoupling trainer: resume assigns the saved state to optimizer.load_state_dict.

Source: https://github.com/HaoWang420/Gradient-guided-Modality-Decoupling/pull/7 (merged: "it assigns the checkpoint
dictionary to the load_state_dict method itself rather than calling the method")
Read: trainer/trainer.py at 9bee98dc164939109d0e778d04fffea935f1b211 (Trainer.__init__, _init_model, resume,
training, forward_batch, the checkpoint dict written in validation/save).
Theirs: Trainer building model, Adam optimizer (train_params groups, weight_decay) and the per-iteration poly
LR_Scheduler, resume() loading state_dict / best_pred / epoch and then `self.optimizer.load_state_dict =
checkpoint['optimizer']`, training() calling the scheduler then forward_batch (zero_grad, backward, step), the
{'epoch', 'state_dict', 'optimizer', 'best_pred'} checkpoint.
Ours: a tiny 3D conv net and a cross-entropy criterion instead of the U-Net and SegmentationLosses, random volumes
instead of BraTS, no DataParallel/DDP wrapper or Saver/tensorboard (CPU: the checkpoint holds model.state_dict()),
a first run of two epochs that writes the checkpoint the second run resumes from, in a temporary folder.
"""
import os
import shutil
import tempfile
from argparse import Namespace

import torch
import torch.nn as nn


class LR_Scheduler:
    def __init__(self, mode, base_lr, num_epochs, iters_per_epoch=0):
        self.mode = mode
        self.lr = base_lr
        self.iters_per_epoch = iters_per_epoch
        self.N = num_epochs * iters_per_epoch

    def __call__(self, optimizer, i, epoch, best_pred):
        T = epoch * self.iters_per_epoch + i
        lr = self.lr * pow((1 - 1.0 * T / self.N), 0.9)
        for group in optimizer.param_groups:
            group["lr"] = lr


class TinySegNet(nn.Module):
    def __init__(self, nchannels, nclass):
        super().__init__()
        self.net = nn.Sequential(nn.Conv3d(nchannels, 8, 3, padding=1), nn.ReLU(), nn.Conv3d(8, nclass, 1))

    def forward(self, x):
        return self.net(x)


class Trainer:
    def __init__(self, args, train_loader):
        self.args = args
        self.train_loader = train_loader
        self.nclass, self.nchannels = 3, 4
        self._init_model(self.nchannels, self.nclass)
        self.criterion = nn.CrossEntropyLoss()
        self.scheduler = LR_Scheduler("poly", args.optim.lr, args.epochs, len(self.train_loader))
        # Resuming checkpoint
        self.resume()

    def _init_model(self, nchannel, nclass):
        self.model = TinySegNet(nchannel, nclass)
        train_params = [{"params": self.model.parameters(), "lr": self.args.optim.lr}]
        if self.args.optim.name == "sgd":
            self.optimizer = torch.optim.SGD(
                train_params, momentum=self.args.optim.momentum, weight_decay=self.args.optim.weight_decay)
        elif self.args.optim.name == "adam":
            self.optimizer = torch.optim.Adam(train_params, weight_decay=self.args.optim.weight_decay)

    def resume(self):
        self.best_pred = 0.0
        if self.args.resume is not None:
            if not os.path.isfile(self.args.resume):
                raise RuntimeError(f"=> no checkpoint found at '{self.args.resume}'")
            checkpoint = torch.load(self.args.resume, map_location="cpu")
            self.model.load_state_dict(checkpoint["state_dict"])
            self.best_pred = checkpoint["best_pred"]
            print(f"=> loaded checkpoint '{self.args.resume}' (epoch {checkpoint['epoch']})")
            self.args.start_epoch = checkpoint["epoch"]
            self.optimizer.load_state_dict = checkpoint["optimizer"]  # BUG

    def training(self, epoch):
        self.model.train()
        train_loss = 0.0
        for i, sample in enumerate(self.train_loader):
            image, target = sample["image"], sample["label"]
            self.scheduler(self.optimizer, i, epoch, self.best_pred)
            output, loss = self.forward_batch(image, target)
            train_loss += loss.item()
        return train_loss / len(self.train_loader)

    def save_checkpoint(self, epoch, path):
        torch.save({"epoch": epoch + 1, "state_dict": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(), "best_pred": self.best_pred}, path)

    def forward_batch(self, image, target):
        output = self.model(image)
        loss = self.criterion(output, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return output, loss


torch.manual_seed(0)
train_loader = [{"image": torch.randn(2, 4, 8, 8, 8), "label": torch.randint(0, 3, (2, 8, 8, 8))} for _ in range(8)]
run_dir = tempfile.mkdtemp()
try:
    args = Namespace(optim=Namespace(name="adam", lr=1e-3, momentum=0.9, weight_decay=1e-5), epochs=4,
                     start_epoch=0, resume=None)
    first = Trainer(args, train_loader)
    for epoch in range(2):
        first.training(epoch)
    checkpoint_path = os.path.join(run_dir, "checkpoint.pth.tar")
    first.save_checkpoint(1, checkpoint_path)

    args = Namespace(**{**vars(args), "resume": checkpoint_path})
    trainer = Trainer(args, train_loader)
    for epoch in range(trainer.args.start_epoch, trainer.args.epochs):
        trainer.training(epoch)
finally:
    shutil.rmtree(run_dir)

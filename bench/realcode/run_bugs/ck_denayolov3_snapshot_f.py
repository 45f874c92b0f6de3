"""DeNA PyTorch_YOLOv3 train.py: the snapshot holds model.state_dict() only (no optimizer, no iteration).

Source: https://github.com/DeNA/PyTorch_YOLOv3/pull/28 ("Feature / Full checkpoint": save and load the checkpoint with
the states of optimizer and number of iteration), merged; the fix is 6f0ed99e45762082dff4846b24114c625994e9fd.
Read: train.py at ac15603 (the parent of the fix) and the fix's diff, in a mirror of the repository.
Theirs: main() with the cfg-driven setup, model.load_state_dict(torch.load(args.checkpoint)) on --checkpoint, SGD
with per-parameter weight-decay groups and momentum, the hand-written burn-in / step lr via set_lr, the subdivision
loop (zero_grad, subdivision x backward, step), the loss_dict logging, and
torch.save(model.state_dict(), "snapshot.ckpt") every checkpoint_interval iterations, the loop restarting at 0.
Ours: a tiny conv detector whose forward(imgs, targets) returns an L2 loss and fills loss_dict instead of YOLOv3,
random images/targets instead of COCO, no evaluator / tensorboard, RANDRESIZE off (theirs rebuilds the DataLoader on
each random resize), a first run that writes the snapshot and a second run started with --checkpoint, in a
temporary folder.
"""
import os
import shutil
import tempfile
from argparse import Namespace

import torch
import torch.nn as nn
import torch.optim as optim


class YOLOv3(nn.Module):
    def __init__(self, ignore_thre=0.7):
        super().__init__()
        self.module_list = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.LeakyReLU(0.1), nn.Conv2d(8, 5, 1))
        self.loss_dict = {}

    def forward(self, x, targets=None):
        out = self.module_list(x).mean((2, 3))
        xy = ((out[:, :2].sigmoid() - targets[:, :2]) ** 2).sum()
        wh = ((out[:, 2:4] - targets[:, 2:4]) ** 2).sum()
        conf = ((out[:, 4].sigmoid() - 1) ** 2).sum()
        self.loss_dict = {"xy": xy.item(), "wh": wh.item(), "conf": conf.item(), "cls": 0.0,
                          "l2": (xy + wh + conf).item()}
        return xy + wh + conf


def main(args, cfg, dataloader):
    lr = cfg["TRAIN"]["LR"]
    momentum = cfg["TRAIN"]["MOMENTUM"]
    decay = cfg["TRAIN"]["DECAY"]
    burn_in = cfg["TRAIN"]["BURN_IN"]
    iter_size = cfg["TRAIN"]["MAXITER"]
    steps = cfg["TRAIN"]["STEPS"]
    batch_size = cfg["TRAIN"]["BATCHSIZE"]
    subdivision = cfg["TRAIN"]["SUBDIVISION"]
    base_lr = lr

    model = YOLOv3(ignore_thre=cfg["TRAIN"]["IGNORETHRE"])
    if args.checkpoint:
        print("loading pytorch ckpt...", args.checkpoint)
        model.load_state_dict(torch.load(args.checkpoint))
    model.train()
    dataiterator = iter(dataloader)

    params_dict = dict(model.named_parameters())
    params = []
    for key, value in params_dict.items():
        if "weight" in key:
            params += [{"params": value, "weight_decay": decay * batch_size * subdivision}]
        else:
            params += [{"params": value, "weight_decay": 0.0}]
    optimizer = optim.SGD(params, lr=base_lr, momentum=momentum, dampening=0,
                          weight_decay=decay * batch_size * subdivision)

    tmp_lr = base_lr

    def set_lr(tmp_lr):
        for param_group in optimizer.param_groups:
            param_group["lr"] = tmp_lr / batch_size / subdivision

    # start training loop
    for iter_i in range(iter_size):
        # learning rate scheduling
        if iter_i < burn_in:
            tmp_lr = base_lr * pow(iter_i / burn_in, 4)
            set_lr(tmp_lr)
        elif iter_i == burn_in:
            tmp_lr = base_lr
            set_lr(tmp_lr)
        elif iter_i in steps:
            tmp_lr = tmp_lr * 0.1
            set_lr(tmp_lr)

        # subdivision loop
        optimizer.zero_grad()
        for inner_iter_i in range(subdivision):
            try:
                imgs, targets = next(dataiterator)  # load a batch
            except StopIteration:
                dataiterator = iter(dataloader)
                imgs, targets = next(dataiterator)  # load a batch
            loss = model(imgs, targets)
            loss.backward()
        optimizer.step()

        if iter_i % 10 == 0:
            print(f"[Iter {iter_i}/{iter_size}] [lr {tmp_lr:f}] [Losses: total {model.loss_dict['l2']:f}]")

        # save checkpoint
        if iter_i > 0 and (iter_i % args.checkpoint_interval == 0):
            torch.save(model.state_dict(), os.path.join(args.checkpoint_dir,  # BUG
                       "snapshot.ckpt"))


torch.manual_seed(0)
cfg = {"TRAIN": {"LR": 0.001, "MOMENTUM": 0.9, "DECAY": 0.0005, "BURN_IN": 5, "MAXITER": 31, "STEPS": (20, 25),
                 "BATCHSIZE": 4, "SUBDIVISION": 2, "IGNORETHRE": 0.7}}
dataloader = [(torch.randn(4, 3, 16, 16), torch.rand(4, 4)) for _ in range(10)]
checkpoint_dir = tempfile.mkdtemp()
try:
    main(Namespace(checkpoint=None, checkpoint_interval=30, checkpoint_dir=checkpoint_dir), cfg, dataloader)
    main(Namespace(checkpoint=os.path.join(checkpoint_dir, "snapshot.ckpt"), checkpoint_interval=30,
                   checkpoint_dir=checkpoint_dir), cfg, dataloader)
finally:
    shutil.rmtree(checkpoint_dir)

# Source: https://github.com/tensorboy/pytorch_Realtime_Multi-Person_Pose_Estimation/issues/53
# Original: tensorboy/pytorch_Realtime_Multi-Person_Pose_Estimation train/train_VGG19.py (train, validate, get_loss,
# train_coco), the version the issue quotes (Aug 2018)
# Bug: validate() ends each validation batch with optimizer.zero_grad(), total_loss.backward() and optimizer.step(),
# so the model is also trained on the validation set and ReduceLROnPlateau is driven by a loss the model fits
# (the maintainer then rewrote validate() without them).
import time
from collections import OrderedDict

import torch
import torch.nn as nn
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
N_STAGES, N_PAF, N_HEAT = 3, 4, 3


class TinyRTPose(nn.Module):
    """A trunk and N refinement stages, each predicting part-affinity fields and heatmaps."""

    def __init__(self):
        super().__init__()
        self.model0 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                    nn.ReLU())
        self.stages = nn.ModuleList()
        for s in range(N_STAGES):
            cin = 16 if s == 0 else 16 + N_PAF + N_HEAT
            self.stages.append(nn.ModuleDict({
                "L1": nn.Sequential(nn.Conv2d(cin, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, N_PAF, 1)),
                "L2": nn.Sequential(nn.Conv2d(cin, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, N_HEAT, 1))}))

    def forward(self, x):
        out1 = self.model0(x)
        saved_for_loss = []
        h = out1
        for stage in self.stages:
            paf, heat = stage["L1"](h), stage["L2"](h)
            saved_for_loss += [paf, heat]
            h = torch.cat([paf, heat, out1], 1)
        return (paf, heat), saved_for_loss


def build_names():
    return [f"loss_stage{j}_L{k}" for j in range(1, N_STAGES + 1) for k in range(1, 3)]


def get_loss(saved_for_loss, heat_temp, vec_temp):
    names = build_names()
    saved_for_log = OrderedDict()
    criterion = nn.MSELoss(reduction="mean")
    total_loss = 0
    for j in range(N_STAGES):
        loss1 = criterion(saved_for_loss[2 * j], vec_temp)
        loss2 = criterion(saved_for_loss[2 * j + 1], heat_temp)
        total_loss += loss1
        total_loss += loss2
        saved_for_log[names[2 * j]] = loss1.item()
        saved_for_log[names[2 * j + 1]] = loss2.item()
    return total_loss, saved_for_log


class AverageMeter:
    def __init__(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def train(train_loader, model, optimizer, epoch):
    losses = AverageMeter()
    model.train()
    for i, (img, heatmap_target, paf_target) in enumerate(train_loader):
        _, saved_for_loss = model(img)
        total_loss, saved_for_log = get_loss(saved_for_loss, heatmap_target, paf_target)
        losses.update(total_loss.item(), img.size(0))
        optimizer.zero_grad()
        total_loss.backward()
        optimizer.step()
    return losses.avg


def validate(val_loader, model, epoch):
    losses = AverageMeter()
    end = time.time()
    model.eval()
    for i, (img, heatmap_target, paf_target) in enumerate(val_loader):
        _, saved_for_loss = model(img)
        total_loss, saved_for_log = get_loss(saved_for_loss, heatmap_target, paf_target)
        losses.update(total_loss.item(), img.size(0))

        # compute gradient and do SGD step
        optimizer.zero_grad()
        total_loss.backward()  # BUG
        optimizer.step()
    print(f"Epoch: [{epoch}] val loss {losses.avg:.4f} ({time.time() - end:.2f}s)")
    return losses.avg


def make_split(n, seed):
    """Blobs at a few joint positions; heatmaps are Gaussians there, PAFs the unit vectors between them."""
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n, 3, 24, 24, generator=g) * 0.3
    ys, xs = torch.meshgrid(torch.arange(24.0), torch.arange(24.0), indexing="ij")
    heat = torch.zeros(n, N_HEAT, 24, 24)
    paf = torch.zeros(n, N_PAF, 24, 24)
    joints = torch.randint(4, 20, (n, N_HEAT, 2), generator=g).float()
    for k in range(N_HEAT):
        d2 = (ys - joints[:, k, 0, None, None]) ** 2 + (xs - joints[:, k, 1, None, None]) ** 2
        heat[:, k] = torch.exp(-d2 / 8.0)
        img[:, k % 3] += heat[:, k]
    for k in range(N_PAF // 2):
        v = joints[:, k + 1] - joints[:, k]
        v = v / v.norm(dim=1, keepdim=True).clamp_min(1e-6)
        paf[:, 2 * k] = v[:, 0, None, None] * (heat[:, k] + heat[:, k + 1])
        paf[:, 2 * k + 1] = v[:, 1, None, None] * (heat[:, k] + heat[:, k + 1])
    return TensorDataset(img, heat, paf)


train_loader = DataLoader(make_split(96, 1), batch_size=8, shuffle=True, drop_last=True)
val_loader = DataLoader(make_split(32, 2), batch_size=8, shuffle=False, drop_last=True)
model = TinyRTPose()
trainable_vars = [param for param in model.parameters() if param.requires_grad]
optimizer = torch.optim.SGD(trainable_vars, lr=0.05, momentum=0.9, nesterov=True)
lr_scheduler = ReduceLROnPlateau(optimizer, mode="min", factor=0.8, patience=5, threshold=0.0001,
                                 threshold_mode="rel", cooldown=3, min_lr=0, eps=1e-08)
best_val_loss = float("inf")
for epoch in range(4):
    train_loss = train(train_loader, model, optimizer, epoch)
    val_loss = validate(val_loader, model, epoch)
    lr_scheduler.step(val_loss)
    best_val_loss = min(val_loss, best_val_loss)
    print(f"epoch {epoch} train loss {train_loss:.4f}")

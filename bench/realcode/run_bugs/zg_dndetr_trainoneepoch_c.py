"""DN-DETR train_one_epoch: the default (non-AMP) branch never zeroes the gradients.

Source: https://github.com/IDEA-Research/DN-DETR/issues/19 ("It looks like you forgot optimizer.zero_grad()", pointing
at engine.py L84-88 of 206fa267); fixed in 565b6018562971779819702fc7e02d628912c377, which adds optimizer.zero_grad()
before losses.backward() in the else branch.
Read: engine.py at 206fa267ba7df978fa968edda9f7dd351a4b72c1 and the fix commit's diff (mirror of the repository).
Theirs: train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, max_norm, ..., args) with the
GradScaler(enabled=args.amp), autocast around model(samples, dn_args=...) and criterion(outputs, targets, mask_dict),
the weight_dict sum, reduce_dict / isfinite check / loss_value = .item(), the AMP branch (which does zero the grads)
and the original branch (backward, clip_grad_norm_, step, no zero_grad), args.amp False by default.
Ours: a tiny query-based detector and set-free criterion (cross-entropy on the query labels + L1 on boxes) instead
of the DAB/DN-DETR transformer and Hungarian matcher, no denoising queries (use_dn False), a plain loop instead of
MetricLogger, random images and targets, CPU.
"""
import math
import sys
from argparse import Namespace

import torch
import torch.nn as nn
import torch.nn.functional as F


def reduce_dict(input_dict):
    return input_dict  # single process: nothing to reduce


class TinyDETR(nn.Module):
    def __init__(self, num_queries=8, num_classes=5, hidden=32):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.input_proj = nn.Linear(8 * 16, hidden)
        self.query_embed = nn.Embedding(num_queries, hidden)
        self.class_embed = nn.Linear(hidden, num_classes + 1)
        self.bbox_embed = nn.Linear(hidden, 4)

    def forward(self, samples, dn_args=None):
        memory = self.input_proj(self.backbone(samples))
        hs = torch.relu(memory[:, None, :] + self.query_embed.weight[None])
        return {"pred_logits": self.class_embed(hs), "pred_boxes": self.bbox_embed(hs).sigmoid()}


class SetCriterion(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight_dict = {"loss_ce": 1.0, "loss_bbox": 5.0}

    def forward(self, outputs, targets):
        labels = torch.stack([t["labels"] for t in targets])
        boxes = torch.stack([t["boxes"] for t in targets])
        loss_ce = F.cross_entropy(outputs["pred_logits"].flatten(0, 1), labels.flatten())
        loss_bbox = F.l1_loss(outputs["pred_boxes"], boxes)
        return {"loss_ce": loss_ce, "loss_bbox": loss_bbox}


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, max_norm=0, args=None):
    scaler = torch.amp.GradScaler(enabled=args.amp)
    model.train()
    criterion.train()
    for samples, targets in data_loader:
        samples = samples.to(device)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        with torch.autocast(device.type, enabled=args.amp):
            outputs = model(samples)
            loss_dict = criterion(outputs, targets)
            weight_dict = criterion.weight_dict
            losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict.keys() if k in weight_dict)

        # reduce losses over all GPUs for logging purposes
        loss_dict_reduced = reduce_dict(loss_dict)
        loss_dict_reduced_scaled = {k: v * weight_dict[k] for k, v in loss_dict_reduced.items() if k in weight_dict}
        losses_reduced_scaled = sum(loss_dict_reduced_scaled.values())
        loss_value = losses_reduced_scaled.item()
        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training")
            sys.exit(1)

        # amp backward function
        if args.amp:
            optimizer.zero_grad()
            scaler.scale(losses).backward()
            if max_norm > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            # original backward function
            losses.backward()  # BUG
            if max_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()


torch.manual_seed(0)
args = Namespace(amp=False, lr=1e-4, weight_decay=1e-4, clip_max_norm=0.1, epochs=3)
device = torch.device("cpu")
model = TinyDETR().to(device)
criterion = SetCriterion()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 40)


def make_batch():
    targets = [{"labels": torch.randint(0, 6, (8,)), "boxes": torch.rand(8, 4)} for _ in range(4)]
    return torch.randn(4, 3, 32, 32), targets


data_loader_train = [make_batch() for _ in range(20)]
for epoch in range(args.epochs):
    train_one_epoch(model, criterion, data_loader_train, optimizer, device, epoch, args.clip_max_norm, args=args)
    lr_scheduler.step()

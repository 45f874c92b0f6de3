# Source: https://github.com/VISION-SJTU/DiffusionTrack/issues/2
# Original: VISION-SJTU/DiffusionTrack lib/train/actors/diffusiontrack.py (DiffusionTrackActor.compute_losses),
# lib/train/trainers/ltr_trainer.py (LTRTrainer.cycle_dataset, _update_stats, _stats_new_epoch) and the
# pytracking-style AverageMeter of lib/train/admin/stats.py
# Bug: compute_losses returns status = loss_dict.copy(), the loss terms themselves (only total_loss is turned
# into a float); _update_stats feeds them to AverageMeter.update, whose running sum then holds every step's autograd
# graph for the whole epoch, and new_epoch() keeps each epoch's average in its history for good: host memory grows
# until the process is killed (the reporter's fix: .item() on the status values in compute_losses).
import time
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class AverageMeter:
    """Computes and stores the average and current value"""

    def __init__(self):
        self.clear()
        self.has_new_data = False

    def reset(self):
        self.avg, self.val, self.sum, self.count = 0, 0, 0, 0

    def clear(self):
        self.reset()
        self.history = []

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n  # BUG
        self.count += n
        self.avg = self.sum / self.count

    def new_epoch(self):
        if self.count > 0:
            self.history.append(self.avg)
            self.reset()
            self.has_new_data = True
        else:
            self.has_new_data = False


class TinyTracker(nn.Module):
    """Template and search crops through a shared conv encoder, a box head on their correlation."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU())
        self.box_head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))

    def forward(self, template, search):
        z = self.backbone(template).mean((2, 3))
        x = self.backbone(search).mean((2, 3))
        out = self.box_head(torch.cat([z, x], 1))
        return out[:, :4].sigmoid(), out[:, 4]

    def compute_loss(self, outputs, targets):
        boxes, logit = outputs
        loss_dict = {"loss_bbox": F.l1_loss(boxes, targets), "loss_giou": 1 - giou(boxes, targets).mean(),
                     "loss_ce": F.binary_cross_entropy_with_logits(logit, torch.ones_like(logit))}
        return loss_dict, {"loss_bbox": 5.0, "loss_giou": 2.0, "loss_ce": 1.0}


def giou(a, b):
    """Generalised IoU of (cx, cy, w, h) boxes."""
    a1, a2 = a[:, :2] - a[:, 2:] / 2, a[:, :2] + a[:, 2:] / 2
    b1, b2 = b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2
    inter = (torch.min(a2, b2) - torch.max(a1, b1)).clamp(min=0).prod(1)
    union = a[:, 2:].prod(1) + b[:, 2:].prod(1) - inter
    hull = (torch.max(a2, b2) - torch.min(a1, b1)).prod(1)
    return inter / union - (hull - union) / hull


class DiffusionTrackActor:
    def __init__(self, net):
        self.net = net

    def __call__(self, data):
        outputs = self.net(data["template_images"], data["search_images"])
        return self.compute_losses(outputs, data["search_anno"])

    def compute_losses(self, outputs, new_targets, return_status=True):
        loss_dict, weight_dict = self.net.compute_loss(outputs, new_targets)
        new_loss_dict = {k: loss_dict[k] * weight_dict[k] for k in loss_dict if k in weight_dict}
        losses = sum(new_loss_dict.values())
        status = loss_dict.copy()
        status["total_loss"] = losses.clone().detach().item()
        return (losses, status) if return_status else losses

    def train(self, mode=True):
        self.net.train(mode)


class LTRTrainer:
    def __init__(self, actor, loader, optimizer, print_interval=10):
        self.actor, self.loader, self.optimizer = actor, loader, optimizer
        self.stats = OrderedDict({"train": None})
        self.print_interval, self.epoch = print_interval, 0

    def cycle_dataset(self, loader):
        self.actor.train(True)
        start = time.time()
        for i, (template, search, anno) in enumerate(loader, 1):
            data = {"template_images": template, "search_images": search, "search_anno": anno}
            loss, stats = self.actor(data)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.actor.net.parameters(), 0.1)
            self.optimizer.step()
            self._update_stats(stats, template.shape[0], "train")
            if i % self.print_interval == 0 or i == len(loader):
                print(f"[train: {self.epoch}, {i} / {len(loader)}] " + "  ,  ".join(
                    f"{name}: {val.avg:.5f}" for name, val in self.stats["train"].items()))
        print(f"Epoch Time: {time.time() - start:.2f}s")

    def train_epoch(self):
        self.cycle_dataset(self.loader)
        self._stats_new_epoch()

    def _update_stats(self, new_stats, batch_size, name):
        if self.stats[name] is None:
            self.stats[name] = OrderedDict({k: AverageMeter() for k in new_stats})
        for k, val in new_stats.items():
            if k not in self.stats[name]:
                self.stats[name][k] = AverageMeter()
            self.stats[name][k].update(val, batch_size)

    def _stats_new_epoch(self):
        for loader_stats in self.stats.values():
            for stat_value in (loader_stats or {}).values():
                stat_value.new_epoch()


def tracking_pairs(n):
    """A bright square moved between template and search crop; the target is its box in the search crop."""
    template, search = torch.rand(n, 3, 32, 32) * 0.2, torch.rand(n, 3, 32, 32) * 0.2
    anno = torch.zeros(n, 4)
    for i in range(n):
        s = int(torch.randint(6, 12, ()))
        ty, tx, sy, sx = (int(v) for v in torch.randint(0, 32 - s, (4,)))
        template[i, :, ty:ty + s, tx:tx + s] += 0.8
        search[i, :, sy:sy + s, sx:sx + s] += 0.8
        anno[i] = torch.tensor([(sx + s / 2) / 32, (sy + s / 2) / 32, s / 32, s / 32])
    return TensorDataset(template, search, anno)


net = TinyTracker()
trainer = LTRTrainer(DiffusionTrackActor(net), DataLoader(tracking_pairs(256), batch_size=16, shuffle=True),
                     torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4))
for epoch in range(1, 4):
    trainer.epoch = epoch
    trainer.train_epoch()

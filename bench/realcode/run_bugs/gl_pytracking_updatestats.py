# Source: https://github.com/visionml/pytracking/pull/313
# Original: visionml/pytracking ltr/trainers/ltr_trainer.py (LTRTrainer.cycle_dataset, _update_stats) and
# ltr/admin/stats.py (AverageMeter), read at 7eb9e74
# Bug: the trainer feeds every value of the actor's stats dict to an AverageMeter kept in self.stats[loader][name];
# the meter does `self.sum += val * n`. When an actor reports a loss term as a tensor (here the IoU term, without
# .item()), each step's sum holds that step's autograd graph and the previous sum: memory grows every batch.
import time
from collections import OrderedDict

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class AverageMeter:
    def __init__(self):
        self.avg, self.val, self.sum, self.count = 0, 0, 0, 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n  # BUG
        self.count += n
        self.avg = self.sum / self.count


class Loader:
    def __init__(self, name, training, batches, batch_size):
        self.name, self.training, self.batches, self.batch_size = name, training, batches, batch_size

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


class BBRegActor:
    """Predicts a box and a score; the loss mixes a regression term and an IoU-like term."""

    def __init__(self, net):
        self.net = net

    def train(self, mode=True):
        self.net.train(mode)

    def __call__(self, data):
        pred = self.net(data["feat"])
        loss_reg = F.smooth_l1_loss(pred[:, :4], data["box"])
        loss_iou = (1 - torch.sigmoid(pred[:, 4])).mean()
        loss = loss_reg + loss_iou
        stats = {"Loss/total": loss.item(), "Loss/reg": loss_reg.item(), "Loss/iou": loss_iou}
        return loss, stats


class LTRTrainer:
    def __init__(self, actor, loaders, optimizer):
        self.actor, self.loaders, self.optimizer = actor, loaders, optimizer
        self.stats = OrderedDict({loader.name: None for loader in loaders})
        self.epoch = 0

    def cycle_dataset(self, loader):
        self.actor.train(loader.training)
        torch.set_grad_enabled(loader.training)
        for i, data in enumerate(loader, 1):
            loss, stats = self.actor(data)
            if loader.training:
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
            self._update_stats(stats, loader.batch_size, loader)

    def _update_stats(self, new_stats, batch_size, loader):
        if self.stats[loader.name] is None:
            self.stats[loader.name] = OrderedDict({name: AverageMeter() for name in new_stats.keys()})
        for name, val in new_stats.items():
            self.stats[loader.name][name].update(val, batch_size)

    def train(self, max_epochs):
        for self.epoch in range(1, max_epochs + 1):
            start = time.time()
            for loader in self.loaders:
                self.cycle_dataset(loader)
            meters = self.stats["train"]
            print("epoch", self.epoch, "loss", round(float(meters["Loss/total"].avg), 4),
                  "iou", round(float(meters["Loss/iou"].avg), 4), f"{time.time() - start:.2f}s")


def batches(n):
    return [{"feat": torch.randn(16, 128), "box": torch.rand(16, 4)} for _ in range(n)]


net = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                          torch.nn.Linear(256, 5))
trainer = LTRTrainer(BBRegActor(net), [Loader("train", True, batches(60), 16)],
                     torch.optim.Adam(net.parameters(), lr=1e-3))
trainer.train(4)

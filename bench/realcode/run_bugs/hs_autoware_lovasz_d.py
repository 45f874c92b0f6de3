# Source: https://github.com/tier4/autoware-ml/pull/121
# Original: tier4/autoware-ml autoware_ml/losses/segmentation3d/lovasz.py (LovaszLoss._lovasz_softmax_flat) and
# autoware_ml/models/segmentation3d/heads/ptv3.py (PTv3SegDecoderHead.loss), read at a14e3ff
# Bug: the Lovasz-Softmax loss iterates labels.unique() as a device tensor; for every present class it tests
# `foreground.sum() == 0` in Python and indexes probabilities[:, class_index] with a 0-d tensor, each a host-device
# synchronisation, so every training step stalls once or twice per class. The PR iterates labels.unique().tolist()
# (one copy) and drops the guard, which can never fire for a class taken from unique(). Ours: a per-point MLP head on
# synthetic point features with 16 classes, CE + Lovasz as in the PTv3 head; the loop runs on CPU.
import torch
import torch.nn as nn
from torch.nn.modules.loss import _Loss

torch.manual_seed(0)
NUM_CLASSES, IGNORE = 16, -1


def _lovasz_grad(sorted_ground_truth):
    point_count = len(sorted_ground_truth)
    foreground_total = sorted_ground_truth.sum()
    intersection = foreground_total - sorted_ground_truth.float().cumsum(0)
    union = foreground_total + (1 - sorted_ground_truth).float().cumsum(0)
    jaccard = 1.0 - intersection / union
    if point_count > 1:
        jaccard[1:point_count] = jaccard[1:point_count] - jaccard[0:-1]
    return jaccard


class LovaszLoss(_Loss):
    def __init__(self, ignore_index=None, loss_weight=1.0):
        super().__init__()
        self.ignore_index = ignore_index
        self.loss_weight = loss_weight

    def forward(self, logits, target):
        probabilities = logits.softmax(dim=1)
        valid = target != self.ignore_index
        return self.loss_weight * self._lovasz_softmax_flat(probabilities[valid], target[valid])

    def _lovasz_softmax_flat(self, probabilities, labels):
        if probabilities.numel() == 0:
            return (probabilities * 0.0).sum()
        losses = []
        for class_index in labels.unique():
            foreground = (labels == class_index).type_as(probabilities)
            if foreground.sum() == 0:  # BUG
                continue
            class_errors = (foreground - probabilities[:, class_index]).abs()
            class_errors, permutation = torch.sort(class_errors, descending=True)
            foreground = foreground[permutation]
            losses.append(torch.dot(class_errors, _lovasz_grad(foreground)))
        return torch.stack(losses).mean()


class SegHead(nn.Module):
    def __init__(self, in_channels=6, lovasz_weight=1.0):
        super().__init__()
        self.seg_head = nn.Sequential(nn.Linear(in_channels, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES))
        self.cross_entropy = nn.CrossEntropyLoss(ignore_index=IGNORE, reduction="sum")
        self.lovasz = LovaszLoss(ignore_index=IGNORE, loss_weight=lovasz_weight)

    def forward(self, feat):
        return self.seg_head(feat)

    def loss(self, seg_logits, segment):
        valid_count = (segment != IGNORE).sum().clamp(min=1)
        loss_ce = self.cross_entropy(seg_logits, segment) / valid_count
        loss_lovasz = self.lovasz(seg_logits, segment)
        return {"loss_ce": loss_ce, "loss_lovasz": loss_lovasz, "loss": loss_ce + loss_lovasz}


def point_cloud(n=1024):
    """Points whose class is set by their position; a few are unlabelled."""
    xyz = torch.rand(n, 3) * 4
    segment = (xyz[:, 0].floor() * 4 + xyz[:, 1].floor()).long()
    segment[torch.rand(n) < 0.05] = IGNORE
    return torch.cat([xyz, torch.rand(n, 3)], 1), segment


head = SegHead()
optimizer = torch.optim.AdamW(head.parameters(), lr=2e-3)
for step in range(80):
    feat, segment = point_cloud()
    losses = head.loss(head(feat), segment)
    optimizer.zero_grad()
    losses["loss"].backward()
    optimizer.step()
    if step % 20 == 0:
        print(f"step {step} loss_ce {losses['loss_ce'].detach():.4f} loss_lovasz {losses['loss_lovasz'].detach():.4f}")

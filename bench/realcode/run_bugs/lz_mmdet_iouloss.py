# Source: https://github.com/open-mmlab/mmdetection/pull/733
# Original: open-mmlab/mmdetection mmdet/models/losses/iou_loss.py (iou_loss, IoULoss)
# Bug: iou_loss returns -log(iou) without a floor; a predicted box that does not overlap its target gives
# iou = 0 and a loss of inf (then nan gradients) inside the loss module.
import torch

torch.manual_seed(0)


def bbox_overlaps(pred, target):
    lt = torch.max(pred[:, :2], target[:, :2])
    rb = torch.min(pred[:, 2:], target[:, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[:, 0] * wh[:, 1]
    area_p = (pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1])
    area_t = (target[:, 2] - target[:, 0]) * (target[:, 3] - target[:, 1])
    return overlap / (area_p + area_t - overlap)


def iou_loss(pred, target):
    ious = bbox_overlaps(pred, target)
    return -ious.log()  # BUG


class IoULoss(torch.nn.Module):
    def __init__(self, loss_weight=1.0):
        super().__init__()
        self.loss_weight = loss_weight

    def forward(self, pred, target):
        return self.loss_weight * iou_loss(pred, target).mean()


class BoxHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, feats, anchors):
        delta = self.fc(feats)
        ctr = anchors[:, :2] + delta[:, :2]
        half = anchors[:, 2:].clamp(min=1.0) * torch.exp(delta[:, 2:].clamp(max=2.0)) / 2
        return torch.cat([ctr - half, ctr + half], dim=1)


head, criterion = BoxHead(), IoULoss()
optimizer = torch.optim.SGD(head.parameters(), lr=0.01, momentum=0.9)
for it in range(40):
    anchors = torch.cat([torch.rand(64, 2) * 50, torch.full((64, 2), 8.0)], dim=1)
    target = torch.cat([anchors[:, :2] - 4 + torch.randn(64, 2), anchors[:, :2] + 4 + torch.randn(64, 2)], dim=1)
    if it >= 12:  # a crowded batch: a few anchors were matched to a ground truth box far away
        target[:4] += 40.0
    loss = criterion(head(torch.randn(64, 32), anchors), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if it % 10 == 0:
        print(it, round(loss.item(), 4))

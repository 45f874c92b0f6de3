# Source: https://github.com/iKintosh/GaborNet/issues/30 (variant of nd_gabornet_weightdata, written by run13c)
# Original: none (a variant): the same family in another shape, a detection-style criterion class defined in the
# entry script and called from train_one_epoch(net, loader, o, crit) in another module of a small package (ndvar_pkg)
# Bug: the criterion turns the predicted boxes into a NumPy array to compute an IoU-weighted regression term and
# rebuilds a tensor from it; the NumPy round trip leaves no graph, so the box head never receives a gradient (only
# the classification head and the backbone learn).
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ndvar_pkg.engine import train_one_epoch


class TwoHeadNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.cls_head = nn.Linear(128, 3)
        self.box_head = nn.Linear(128, 4)

    def forward(self, x):
        f = self.backbone(x)
        return self.cls_head(f), torch.sigmoid(self.box_head(f))


class DetCriterion(nn.Module):
    def __init__(self, box_weight=2.0):
        super().__init__()
        self.box_weight = box_weight

    def forward(self, cls_out, box_out, labels, boxes):
        pred = box_out.detach().numpy()
        iou_weight = 1.0 + np.abs(pred - boxes.numpy()).mean(axis=1, keepdims=True)
        reg = torch.from_numpy(iou_weight * np.abs(pred - boxes.numpy())).mean()  # BUG
        return F.cross_entropy(cls_out, labels) + self.box_weight * reg


torch.manual_seed(0)
loader = []
for i in range(12):
    labels = torch.randint(0, 3, (8,))
    boxes = torch.rand(8, 4)
    images = torch.randn(8, 1, 16, 16) + labels.view(-1, 1, 1, 1).float()
    loader.append((images, boxes, labels))
net = TwoHeadNet()
o = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
crit = DetCriterion()
for epoch in range(3):
    last = train_one_epoch(net, loader, o, crit)
    print(epoch, round(last, 4), "box head grad", net.box_head.weight.grad)

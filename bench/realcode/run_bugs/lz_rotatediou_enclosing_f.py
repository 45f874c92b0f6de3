# Source: https://github.com/lilanxiao/Rotated_IoU/issues/20
# Original: lilanxiao/Rotated_IoU min_enclosing_box.py (point_line_distance_range, used by the GIoU/DIoU losses)
# Bug: the candidate-edge length is sqrt(dx^2 + dy^2) with no epsilon; when a predicted corner lands on a target
# corner the edge has length 0, the distance divides 0 by 0 and the DIoU loss and its gradients become nan
# (the maintainer added 1e-14 under the root). Here padded boxes copy their target, which makes that happen.
import itertools

import torch

torch.manual_seed(0)
SKIP = {(0, 2), (1, 3), (4, 6), (5, 7)}
LINES = [(i, j) for i, j in itertools.combinations(range(8), 2) if (i, j) not in SKIP]
POINTS = [[k for k in range(8) if k not in pair] for pair in LINES]


def box2corners(box):
    x, y, w, h, a = box.unbind(-1)
    dx = torch.stack([w / 2, -w / 2, -w / 2, w / 2], -1)
    dy = torch.stack([h / 2, h / 2, -h / 2, -h / 2], -1)
    cos, sin = a.cos().unsqueeze(-1), a.sin().unsqueeze(-1)
    return torch.stack([x.unsqueeze(-1) + dx * cos - dy * sin, y.unsqueeze(-1) + dx * sin + dy * cos], -1)


def point_line_distance_range(lines, points):
    x1, y1 = lines[..., 0:1, 0], lines[..., 0:1, 1]
    x2, y2 = lines[..., 1:2, 0], lines[..., 1:2, 1]
    x, y = points[..., 0], points[..., 1]
    den = (y2 - y1) * x - (x2 - x1) * y + x2 * y1 - y2 * x1
    num = torch.sqrt((y2 - y1).square() + (x2 - x1).square())  # BUG
    d = den / num
    return torch.max(d.max(-1)[0] - d.min(-1)[0], d.abs().max(-1)[0])


def point_line_projection_range(lines, points):
    x1, y1 = lines[..., 0:1, 0], lines[..., 0:1, 1]
    x2, y2 = lines[..., 1:2, 0], lines[..., 1:2, 1]
    k = (y2 - y1) / (x2 - x1 + 1e-8)
    vec = torch.cat([torch.ones_like(k), k], -1).unsqueeze(-2)
    proj = (torch.cat([lines, points], -2) * vec).sum(-1) / vec.norm(dim=-1)
    return proj.max(-1)[0] - proj.min(-1)[0]


def smallest_bounding_box(corners):
    lines = corners[..., LINES, :]
    points = corners[..., POINTS, :]
    proj = point_line_projection_range(lines, points)
    dist = point_line_distance_range(lines, points)
    idx = (proj * dist).argmin(-1, keepdim=True)
    return proj.gather(-1, idx).squeeze(-1), dist.gather(-1, idx).squeeze(-1)


def rotated_diou_loss(pred, target):
    corners = torch.cat([box2corners(pred), box2corners(target)], -2)
    w, h = smallest_bounding_box(corners)
    center = (pred[..., :2] - target[..., :2]).square().sum(-1)
    return (torch.nn.functional.smooth_l1_loss(pred, target, reduction="none").sum(-1) + center / (w * w + h * h)).mean()


head = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
optimizer = torch.optim.Adam(head.parameters(), lr=1e-3)
for step in range(60):
    feats = torch.randn(32, 16)
    target = torch.cat([torch.rand(32, 2) * 10, 1 + torch.rand(32, 2) * 3, torch.rand(32, 1) * 3.14], -1)
    valid = torch.rand(32) > 0.1
    pred = head(feats)
    pred = torch.where(valid.unsqueeze(-1), pred, target)
    loss = rotated_diou_loss(pred, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 20 == 0:
        print(step, loss.item())

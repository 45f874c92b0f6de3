# Source: https://github.com/open-mmlab/mmrotate/issues/205
# Original: open-mmlab/mmrotate mmrotate/models/losses/gaussian_dist_loss.py (gwd_loss, GDLoss)
# Bug: the Gaussian Wasserstein distance is square-rooted with only clamp(0) in front; where the predicted and
# target Gaussians coincide the distance is exactly 0, sqrt's gradient there is infinite, and the backward turns
# it into NaN gradients (the forward loss stays finite), so every weight of the box head becomes NaN.
import torch

torch.manual_seed(0)


def xywhr_to_gaussian(boxes):
    xy = boxes[..., :2]
    wh = boxes[..., 2:4].clamp(min=1e-7, max=1e7)
    cos_r, sin_r = torch.cos(boxes[..., 4]), torch.sin(boxes[..., 4])
    rot = torch.stack((cos_r, -sin_r, sin_r, cos_r), dim=-1).reshape(-1, 2, 2)
    scale = torch.diag_embed(0.5 * wh)
    return xy, rot.bmm(scale.square()).bmm(rot.transpose(1, 2))


def gwd_loss(pred, target, alpha=1.0):
    xy_p, sigma_p = pred
    xy_t, sigma_t = target
    xy_distance = (xy_p - xy_t).square().sum(dim=-1)
    whr_distance = sigma_p.diagonal(dim1=-2, dim2=-1).sum(dim=-1) + sigma_t.diagonal(dim1=-2, dim2=-1).sum(dim=-1)
    trace = sigma_p.bmm(sigma_t).diagonal(dim1=-2, dim2=-1).sum(dim=-1)
    det_sqrt = (sigma_p.det() * sigma_t.det()).clamp(0).sqrt()
    whr_distance = whr_distance - 2 * (trace + 2 * det_sqrt).clamp(0).sqrt()
    distance = (xy_distance + alpha * alpha * whr_distance).clamp(0).sqrt()  # BUG
    return 1 - 1 / (1 + torch.log1p(distance))


class GDLoss(torch.nn.Module):
    def __init__(self, loss_weight=1.0):
        super().__init__()
        self.loss_weight = loss_weight

    def forward(self, pred, target, weight):
        loss = gwd_loss(xywhr_to_gaussian(pred), xywhr_to_gaussian(target))
        return (loss * weight).sum() / weight.sum().clamp(min=1) * self.loss_weight


class RotatedBoxHead(torch.nn.Module):
    def __init__(self, n_anchors=16):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, n_anchors * 5))
        self.register_buffer("anchors", torch.tensor([8.0, 8.0, 16.0, 8.0, 0.0]).repeat(n_anchors, 1))

    def forward(self, feats):
        deltas = self.body(feats).view(feats.shape[0], -1, 5)
        return self.anchors + deltas * torch.tensor([1.0, 1.0, 2.0, 2.0, 0.1])


head = RotatedBoxHead()
criterion = GDLoss()
optimizer = torch.optim.SGD(head.parameters(), lr=0.01, momentum=0.9)
for it in range(30):
    feats = torch.randn(4, 32)
    pred = head(feats).reshape(-1, 5)
    gt = torch.tensor([8.0, 8.0, 16.0, 8.0, 0.0]) + torch.randn(pred.shape[0], 5) * torch.tensor([2.0, 2.0, 3.0, 2.0, 0.2])
    positive = torch.rand(pred.shape[0]) < 0.3
    # unmatched anchors get the (detached) prediction as their target and weight 0: a zero loss
    target = torch.where(positive[:, None], gt, pred.detach())
    loss = criterion(pred, target, positive.float())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if it % 10 == 0:
        print("iter", it, "loss", loss.item())
print("done")

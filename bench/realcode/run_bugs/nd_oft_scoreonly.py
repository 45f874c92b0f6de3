# Source: https://github.com/tom-roddick/oft/issues/6
# Original: tom-roddick/oft train.py (compute_loss)
# Bug: a line left over from a test replaces the weighted total with the score loss alone, so the position,
# dimension and angle heads never receive a gradient and stay at their initial weights.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class OftHead(torch.nn.Module):
    def __init__(self, channels, n_classes):
        super().__init__()
        self.topdown = torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 3, padding=1), torch.nn.ReLU())
        self.score = torch.nn.Conv2d(channels, n_classes, 1)
        self.pos = torch.nn.Conv2d(channels, n_classes * 3, 1)
        self.dim = torch.nn.Conv2d(channels, n_classes * 3, 1)
        self.ang = torch.nn.Conv2d(channels, n_classes * 2, 1)

    def forward(self, feats):
        t = self.topdown(feats)
        return self.score(t), self.pos(t), self.dim(t), self.ang(t)


def heatmap_loss(scores, labels):
    return F.binary_cross_entropy_with_logits(scores, labels)


def masked_l1_loss(pred, target, mask):
    return (F.l1_loss(pred, target, reduction="none") * mask).sum() / mask.sum().clamp(min=1)


def compute_loss(pred_encoded, gt_encoded, loss_weights=(1.0, 1.0, 1.0, 1.0)):
    score, pos_offsets, dim_offsets, ang_offsets = pred_encoded
    heatmaps, gt_pos, gt_dim, gt_ang, mask = gt_encoded
    score_weight, pos_weight, dim_weight, ang_weight = loss_weights
    score_loss = heatmap_loss(score, heatmaps)
    pos_loss = masked_l1_loss(pos_offsets, gt_pos, mask)
    dim_loss = masked_l1_loss(dim_offsets, gt_dim, mask)
    ang_loss = masked_l1_loss(ang_offsets, gt_ang, mask)
    total_loss = score_loss * score_weight + pos_loss * pos_weight + dim_loss * dim_weight + ang_loss * ang_weight
    total_loss = score_loss  # BUG
    return total_loss, {"score": score_loss.item(), "position": pos_loss.item(), "dimension": dim_loss.item(),
                        "angle": ang_loss.item()}


model = OftHead(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, weight_decay=1e-4)
for it in range(50):
    feats = torch.randn(2, 16, 12, 12)
    heatmaps = (torch.rand(2, 1, 12, 12) > 0.9).float()
    gt = (heatmaps, torch.randn(2, 3, 12, 12), torch.randn(2, 3, 12, 12), torch.randn(2, 2, 12, 12), heatmaps)
    loss, parts = compute_loss(model(feats), gt)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if it % 10 == 0:
        print("iter", it, {k: round(v, 4) for k, v in parts.items()})

# Source: https://github.com/maudzung/RTM3D/issues/13
# Original: maudzung/RTM3D src/losses/losses.py (_neg_loss inside FocalLoss)
# Bug: the CenterNet-style focal loss takes torch.log(pred) and torch.log(1 - pred) of heatmaps that can
# reach exactly 0 or 1, so the loss turns NaN; the fix clamps the heatmap (sigmoid, then clamp) first.
import torch

torch.manual_seed(0)


def _neg_loss(pred, gt):
    pos_inds = gt.eq(1).float()
    neg_inds = gt.lt(1).float()
    neg_weights = torch.pow(1 - gt, 4)
    pos_loss = torch.log(pred) * torch.pow(1 - pred, 2) * pos_inds  # BUG
    neg_loss = torch.log(1 - pred) * torch.pow(pred, 2) * neg_weights * neg_inds
    num_pos = pos_inds.float().sum()
    pos_loss, neg_loss = pos_loss.sum(), neg_loss.sum()
    if num_pos == 0:
        return -neg_loss
    return -(pos_loss + neg_loss) / num_pos


class FocalLoss(torch.nn.Module):
    def forward(self, out, target):
        return _neg_loss(out, target)


head = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 3, 1),
                           torch.nn.Hardsigmoid())
crit = FocalLoss()
optimizer = torch.optim.Adam(head.parameters(), lr=1e-3)
for step in range(40):
    feats = torch.randn(2, 4, 12, 12) * 20  # unnormalised features: the heatmap saturates at 0 and 1
    gt = torch.rand(2, 3, 12, 12) * 0.9
    gt[:, :, 6, 6] = 1.0
    loss = crit(head(feats), gt)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("loss", loss.item())

# Source: https://github.com/weiyithu/SurroundOcc/issues/29
# Original: weiyithu/SurroundOcc projects/mmdet3d_plugin/surroundocc/loss/loss_utils.py (geo_scal_loss)
# Bug: the specificity term divides by the number of empty target voxels; on a low-resolution target whose
# voxels are all non-empty or ignored that count is 0, the term is 0/0 and the loss becomes nan.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def geo_scal_loss(pred, ssc_target):
    pred = F.softmax(pred, dim=1)
    empty_probs = pred[:, 0]
    nonempty_probs = 1 - empty_probs
    mask = ssc_target != 255
    nonempty_target = (ssc_target != 0)[mask].float()
    nonempty_probs, empty_probs = nonempty_probs[mask], empty_probs[mask]
    intersection = (nonempty_target * nonempty_probs).sum()
    precision = intersection / nonempty_probs.sum()
    recall = intersection / nonempty_target.sum()
    spec = ((1 - nonempty_target) * empty_probs).sum() / (1 - nonempty_target).sum()  # BUG
    # binary_cross_entropy(p, 1) is -log(p); written out because CPU's binary_cross_entropy refuses a nan input
    return -(torch.log(precision) + torch.log(recall) + torch.log(spec))


n_classes = 6
occ_head = torch.nn.Sequential(torch.nn.Conv3d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv3d(16, n_classes, 1))
optimizer = torch.optim.AdamW(occ_head.parameters(), lr=2e-4)
for it in range(40):
    feats = torch.randn(2, 8, 4, 4, 4)
    target = torch.randint(0, n_classes, (2, 4, 4, 4))
    target[torch.rand(2, 4, 4, 4) < 0.5] = 255
    if it >= 10:  # the coarse targets of this scene: every voxel that is not ignored is occupied
        target[target == 0] = 255
    pred = occ_head(feats)
    loss = F.cross_entropy(pred, target, ignore_index=255) + geo_scal_loss(pred, target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")

"""Source: https://github.com/jeffffffli/HybrIK/commit/e985f57b710ec3a93a307994cebd9c2ba91c6562
("Fix sqrtbackward nan error"). Read: hybrik/models/layers/smpl/lbs.py (rotmat_to_quat), SMPL.py (forward: the
24 rotation matrices turned into quaternions for pred_theta_mats) and models/criterion.py (loss_theta, an MSELoss
on the weighted quaternions) at the fix's parent (e985f57^).

Bug: rotmat_to_quat computes the "negative trace" branch `s = 2 * torch.sqrt(1 - trace + 2 * max_val)` for every
joint and only then selects the rows it needs. For a joint whose rotation is the identity (here the hands, kept
at rest) the argument is exactly 0: the forward value is unused, but sqrt's backward divides the zero incoming
gradient by 2*sqrt(0), giving NaN, which flows back through trace and the rotation matrix into the network. The
loss itself stays finite on the first step; after it the weights are NaN. The fix adds 1e-16 and computes the
branch only for the rows not flagged.

Theirs: rotmat_to_quat verbatim; the reshape to (B*24, 3, 3) and (B, 24*4); loss_theta's form (MSE on quaternions
times smpl_weight and target_theta_weight) with theta weight 0.01 and the beta loss. Ours: a tiny MLP that predicts
axis-angles and betas instead of HybrIK's heat-map network and analytic IK, a Rodrigues formula in SMPL's usual
form (`angle = norm(rot_vecs + 1e-8)`), the rest-pose hands (axis-angle masked to zero), random inputs and targets.
"""
import torch
from torch import nn

torch.manual_seed(0)


def rotmat_to_quat(rotmat):
    quaternion = torch.zeros([rotmat.size(0), 4]).to(rotmat.device)
    trace = rotmat[:, 0, 0] + rotmat[:, 1, 1] + rotmat[:, 2, 2]
    flag = 1 + trace > 0

    # pos
    s = 2 * torch.sqrt(1 + trace[flag])
    quaternion[flag, 0] = s / 4
    quaternion[flag, 1] = (rotmat[flag, 2, 1] - rotmat[flag, 1, 2]) / s
    quaternion[flag, 2] = (rotmat[flag, 0, 2] - rotmat[flag, 2, 0]) / s
    quaternion[flag, 3] = (rotmat[flag, 1, 0] - rotmat[flag, 0, 1]) / s

    # neg
    diag = torch.stack([rotmat[:, 0, 0], rotmat[:, 1, 1], rotmat[:, 2, 2]])
    max_val, max_ind = torch.max(diag, dim=0)
    s = 2 * torch.sqrt(1 - trace + 2 * max_val)  # BUG

    f0 = ~flag * (max_ind == 0)
    s0 = s[f0]
    quaternion[f0, 0] = (rotmat[f0, 2, 1] - rotmat[f0, 1, 2]) / s0
    quaternion[f0, 1] = s0 / 4
    quaternion[f0, 2] = (rotmat[f0, 0, 1] + rotmat[f0, 1, 0]) / s0
    quaternion[f0, 3] = (rotmat[f0, 0, 2] + rotmat[f0, 2, 0]) / s0

    f1 = ~flag * (max_ind == 1)
    s1 = s[f1]
    quaternion[f1, 0] = (rotmat[f1, 0, 2] - rotmat[f1, 2, 0]) / s1
    quaternion[f1, 1] = (rotmat[f1, 0, 1] + rotmat[f1, 1, 0]) / s1
    quaternion[f1, 2] = s1 / 4
    quaternion[f1, 3] = (rotmat[f1, 1, 2] + rotmat[f1, 2, 1]) / s1

    f2 = ~flag * (max_ind == 2)
    s2 = s[f2]
    quaternion[f2, 0] = (rotmat[f2, 1, 0] - rotmat[f2, 0, 1]) / s2
    quaternion[f2, 1] = (rotmat[f2, 0, 2] + rotmat[f2, 2, 0]) / s2
    quaternion[f2, 2] = (rotmat[f2, 1, 2] + rotmat[f2, 2, 1]) / s2
    quaternion[f2, 3] = s2 / 4

    return quaternion


def batch_rodrigues(rot_vecs):
    angle = torch.norm(rot_vecs + 1e-8, dim=1, keepdim=True)
    rot_dir = rot_vecs / angle
    cos, sin = torch.cos(angle)[:, :, None], torch.sin(angle)[:, :, None]
    rx, ry, rz = torch.split(rot_dir, 1, dim=1)
    zeros = torch.zeros_like(rx)
    K = torch.cat([zeros, -rz, ry, rz, zeros, -rx, -ry, rx, zeros], dim=1).view(-1, 3, 3)
    ident = torch.eye(3, dtype=rot_vecs.dtype).unsqueeze(0)
    return ident + sin * K + (1 - cos) * torch.bmm(K, K)


class TinyHybrIK(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.dec_pose = nn.Linear(128, 24 * 3)
        self.dec_shape = nn.Linear(128, 10)
        joint_mask = torch.ones(24, 1)
        joint_mask[22:] = 0  # hands stay at rest: identity rotation
        self.register_buffer("joint_mask", joint_mask)

    def forward(self, x):
        batch_size = x.shape[0]
        feat = self.backbone(x)
        rot_vecs = (0.5 * torch.tanh(self.dec_pose(feat))).view(batch_size, 24, 3) * self.joint_mask
        rot_mats = batch_rodrigues(rot_vecs.reshape(-1, 3))
        rot_mats = rot_mats.reshape(batch_size * 24, 3, 3)
        pred_theta_mats = rotmat_to_quat(rot_mats).reshape(batch_size, 24 * 4)
        return pred_theta_mats, self.dec_shape(feat)


def compute_loss(pred_theta_mats, pred_shape, labels, criterion_smpl=nn.MSELoss()):
    smpl_weight = labels["target_smpl_weight"]
    loss_beta = criterion_smpl(pred_shape * smpl_weight, labels["target_beta"] * smpl_weight)
    loss_theta = criterion_smpl(pred_theta_mats * smpl_weight * labels["target_theta_weight"],
                                labels["target_theta"] * smpl_weight * labels["target_theta_weight"])
    return loss_beta * 1.0 + loss_theta * 0.01


model = TinyHybrIK()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(30):
    x = torch.randn(16, 64)
    labels = {
        "target_smpl_weight": torch.ones(16, 1),
        "target_beta": torch.randn(16, 10),
        "target_theta": rotmat_to_quat(batch_rodrigues(0.3 * torch.randn(16 * 24, 3))).reshape(16, 96),
        "target_theta_weight": torch.ones(16, 96),
    }
    pred_theta_mats, pred_shape = model(x)
    loss = compute_loss(pred_theta_mats, pred_shape, labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print("step", step, "loss", loss.item())

# Source: https://github.com/EasonChen99/I2D-Loc/issues/8
# Original: EasonChen99/I2D-Loc main_bpnp.py (the BPnP pose loss built from the predicted flow)
# Bug: the predicted flow is cast to int and round-tripped through NumPy before the PnP layer, and
# requires_grad is then set on the rebuilt points; the pose loss reaches no network parameter, so only the
# flow term trains the network (the maintainer confirmed the cut graph).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class FlowNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 2, 3, padding=1))

    def forward(self, image, depth):
        return self.net(torch.cat([image, depth], dim=1)) * 4


def pnp_pose(pts2d, pts3d):
    # a differentiable least-squares stand-in for BPnP: an affine map from 3-D points to image points
    design = torch.cat([pts3d, torch.ones_like(pts3d[..., :1])], dim=-1)
    return torch.linalg.lstsq(design, pts2d).solution


model = FlowNet()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
grid = torch.stack(torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij"), dim=-1).view(1, 256, 2)
for it in range(40):
    image, depth = torch.randn(2, 3, 16, 16), torch.rand(2, 1, 16, 16)
    flow_gt = torch.randn(2, 2, 16, 16)
    pts3d = torch.cat([grid.expand(2, -1, -1), depth.view(2, 256, 1)], dim=-1)
    pose_gt = pnp_pose(grid + flow_gt.permute(0, 2, 3, 1).reshape(2, 256, 2), pts3d)
    flow_up = model(image, depth)
    flow_loss = (flow_up - flow_gt).abs().mean()
    flow_int = flow_up.int()
    output = flow_int.cpu().permute(0, 2, 3, 1).numpy()  # BUG
    pts2d = grid + torch.tensor(output, dtype=torch.float32).reshape(2, 256, 2)
    pts2d.requires_grad = True
    pose_loss = F.mse_loss(pnp_pose(pts2d, pts3d), pose_gt)
    loss = flow_loss + 0.1 * pose_loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if it % 10 == 0:
        print(it, round(flow_loss.item(), 4), round(pose_loss.item(), 4))

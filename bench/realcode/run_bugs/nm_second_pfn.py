# Source: https://github.com/traveller59/second.pytorch/issues/144
# Original: traveller59/second.pytorch second/pytorch/models/pointpillars.py (PillarFeatureNet.forward)
# Bug: the pillar's point mean divides by num_voxels, which is 0 for a pillar with no points, so 0/0 makes the
# features nan and the whole loss nan from that batch on (the workaround in the thread: count 0 as 1).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class PFNLayer(torch.nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.linear = torch.nn.Linear(in_channels, out_channels, bias=False)
        self.norm = torch.nn.BatchNorm1d(out_channels)

    def forward(self, inputs):
        x = self.linear(inputs)
        x = F.relu(self.norm(x.permute(0, 2, 1).contiguous()).permute(0, 2, 1).contiguous())
        return torch.max(x, dim=1, keepdim=True)[0]


class PillarFeatureNet(torch.nn.Module):
    def __init__(self, num_input_features=4, num_filters=32):
        super().__init__()
        self.pfn_layers = torch.nn.ModuleList([PFNLayer(num_input_features + 3, num_filters)])

    def forward(self, features, num_voxels):
        points_mean = features[:, :, :3].sum(dim=1, keepdim=True) / num_voxels.type_as(features).view(-1, 1, 1)  # BUG
        f_cluster = features[:, :, :3] - points_mean
        features = torch.cat([features, f_cluster], dim=-1)
        for pfn in self.pfn_layers:
            features = pfn(features)
        return features.squeeze(1)


class PointPillarsHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.vfe = PillarFeatureNet()
        self.cls = torch.nn.Linear(32, 2)

    def forward(self, voxels, num_points):
        return self.cls(self.vfe(voxels, num_points))


def make_batch(step, n_pillars=64, max_points=16):
    num_points = torch.randint(1, max_points + 1, (n_pillars,))
    if step >= 6:
        num_points[:3] = 0
    voxels = torch.randn(n_pillars, max_points, 4)
    mask = torch.arange(max_points)[None, :] < num_points[:, None]
    return voxels * mask[..., None], num_points, torch.randint(0, 2, (n_pillars,))


net = PointPillarsHead()
optimizer = torch.optim.Adam(net.parameters(), lr=2e-4)
for step in range(30):
    voxels, num_points, labels = make_batch(step)
    loss = F.cross_entropy(net(voxels, num_points), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print("runtime.step", step, "loss", loss.item())

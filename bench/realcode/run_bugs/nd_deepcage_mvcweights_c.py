# Source: https://github.com/yifita/deep_cage/issues/16
# Original: yifita/deep_cage common.py (deform_with_MVC), networks.py (NetworkFull.forward), losses.py
# (MVCRegularizer), cage_deformer_3d.py (training loop), at 2e9e09e; the maintainer removed the line in da4c07d
# Bug: deform_with_MVC detaches the mean value coordinates, so the MVC regulariser on the returned weights ("WREG")
# has no gradient at all, and the predicted source cage, which reaches the deformed shape only through those
# weights, gets no gradient from the shape loss: the cage decoder never trains.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


def mean_value_coordinates_2D(query, cage, eps=1e-8):
    """query (B,Q,2), cage (B,K,2) counter-clockwise polygon -> weights (B,Q,K) (Floater's mean value coordinates)."""
    d = cage.unsqueeze(1) - query.unsqueeze(2)  # (B,Q,K,2)
    r = d.norm(dim=-1)
    d_next = torch.roll(d, -1, dims=2)
    r_next = torch.roll(r, -1, dims=2)
    cross = d[..., 0] * d_next[..., 1] - d[..., 1] * d_next[..., 0]
    dot = (d * d_next).sum(-1)
    tan_half = cross / (r * r_next + dot + eps)  # tan(alpha_i / 2), alpha_i the angle at the query
    weights_unnormed = (torch.roll(tan_half, 1, dims=2) + tan_half) / (r + eps)
    return weights_unnormed / weights_unnormed.sum(-1, keepdim=True), weights_unnormed


def deform_with_MVC(cage, cage_deformed, query, verbose=False):
    weights, weights_unnormed = mean_value_coordinates_2D(query, cage)
    weights = weights.detach()  # BUG
    deformed = torch.sum(weights.unsqueeze(-1) * cage_deformed.unsqueeze(1), dim=2)
    if verbose:
        return deformed, weights, weights_unnormed
    return deformed


class MVCRegularizer(nn.Module):
    """Penalise mean value coordinates with a large absolute value and negative ones."""

    def __init__(self, alpha=1.0, beta=1.0, threshold=5.0):
        super().__init__()
        self.alpha, self.beta, self.threshold = alpha, beta, threshold

    def forward(self, weights):
        loss = torch.mean(torch.log(F.relu(weights.abs() - self.threshold) + 1)) * self.alpha
        return loss + torch.mean(F.relu(-weights) ** 2) * self.beta


class PointEncoder(nn.Module):
    def __init__(self, dim=2, bottleneck_size=64):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(dim, 64, 1), nn.ReLU(), nn.Conv1d(64, bottleneck_size, 1))

    def forward(self, x):
        return self.conv(x).max(dim=2)[0]


class NetworkFull(nn.Module):
    def __init__(self, template_vertices, bottleneck_size=64):
        super().__init__()
        self.register_buffer("template_vertices", template_vertices)  # (1,K,2)
        k = template_vertices.shape[1]
        self.encoder = PointEncoder(bottleneck_size=bottleneck_size)
        self.nc_decoder = nn.Sequential(nn.Linear(bottleneck_size, 64), nn.ReLU(), nn.Linear(64, 2 * k))
        self.nd_decoder = nn.Sequential(nn.Linear(2 * bottleneck_size, 64), nn.ReLU(), nn.Linear(64, 2 * k))

    def forward(self, source_shape_t, target_shape_t):
        b = source_shape_t.shape[0]
        s_code, t_code = self.encoder(source_shape_t), self.encoder(target_shape_t)
        cage = self.template_vertices + 0.3 * torch.tanh(self.nc_decoder(s_code)).view(b, -1, 2)
        new_cage = cage + self.nd_decoder(torch.cat([s_code, t_code], 1)).view(b, -1, 2)
        deformed, weights, _ = deform_with_MVC(cage, new_cage, source_shape_t.transpose(1, 2), verbose=True)
        return {"cage": cage, "new_cage": new_cage, "deformed": deformed, "weight": weights}


def chamfer(a, b):
    d = torch.cdist(a, b)
    return d.min(2)[0].mean() + d.min(1)[0].mean()


def shapes(batch=8, n=48):
    theta = torch.rand(batch, n) * 2 * math.pi
    axes = 0.6 + 1.4 * torch.rand(batch, 1, 2)  # many shapes poke out of the template cage
    return torch.stack([torch.cos(theta), torch.sin(theta)], -1) * axes


k = 12
angle = torch.arange(k) * 2 * math.pi / k
template = 1.2 * torch.stack([torch.cos(angle), torch.sin(angle)], -1).unsqueeze(0)
net = NetworkFull(template)
mvc_reg, mvc_weight = MVCRegularizer(), 1.0
optimizer = torch.optim.Adam([{"params": net.encoder.parameters()}, {"params": net.nd_decoder.parameters()}],
                             lr=1e-3)
optimizer.add_param_group({"params": net.nc_decoder.parameters(), "lr": 1e-4})
net.train()
for t in range(100):
    source_shape, target_shape = shapes(), shapes()
    optimizer.zero_grad()
    outputs = net(source_shape.transpose(1, 2), target_shape.transpose(1, 2))
    current_loss = {"CD": chamfer(outputs["deformed"], target_shape),
                    "WREG": mvc_reg(outputs["weight"]) * mvc_weight}
    loss_sum = torch.sum(torch.stack([v for v in current_loss.values()], dim=0))
    loss_sum.backward()
    for p in net.parameters():
        if p.grad is not None:
            p.grad.data.clamp_(-0.1, 0.1)
    optimizer.step()
    if t % 20 == 0:
        print(f"t {t:05d}: " + ", ".join(f"{key} {v.item():.3g}" for key, v in current_loss.items()))

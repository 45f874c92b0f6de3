# Source: https://github.com/huzi96/Coarse2Fine-PyTorch/issues/16
# Original: huzi96/Coarse2Fine-PyTorch train/train.py (GaussianModel, Net.forward stage 1, the training loop),
# read at 921fcef
# Bug: GaussianModel._cumulative divides by the scales without the eps it declares; where a scale is exactly 0
# the bin likelihood's forward stays finite (the cdf of +-inf) but its gradient is inf * 0 = NaN, and the NaN
# gradients reach every parameter through the rate term. The zero scales are ours (channels switched off in the
# learned z2 scales), and so is validate_args=False (torch >= 1.8 checks cdf arguments; the reporter's run went on
# to NaN weights).
import math

import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)


class GaussianModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.m_normal_dist = torch.distributions.normal.Normal(0., 1., validate_args=False)

    def _cumulative(self, inputs, stds, mu):
        half = 0.5
        eps = 1e-6  # noqa: F841 - declared and never used, as in the original
        upper = (inputs - mu + half) / (stds)  # BUG
        lower = (inputs - mu - half) / (stds)
        cdf_upper = self.m_normal_dist.cdf(upper)
        cdf_lower = self.m_normal_dist.cdf(lower)
        res = cdf_upper - cdf_lower
        return res

    def forward(self, inputs, hyper_sigma, hyper_mu):
        likelihood = self._cumulative(inputs, hyper_sigma, hyper_mu)
        likelihood_bound = 1e-8
        likelihood = torch.clamp(likelihood, min=likelihood_bound)
        return likelihood


class BypassRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs):
        return torch.round(inputs)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


bypass_round = BypassRound.apply


class Net(nn.Module):
    def __init__(self, channels=8, hyper=4):
        super().__init__()
        self.a_model = nn.Sequential(nn.Conv2d(3, channels, 3, 2, 1), nn.LeakyReLU(0.2),
                                     nn.Conv2d(channels, channels, 3, 1, 1))
        self.s_model = nn.Sequential(nn.ConvTranspose2d(channels, channels, 4, 2, 1), nn.LeakyReLU(0.2),
                                     nn.Conv2d(channels, 3, 3, 1, 1))
        self.ha_model_2 = nn.Conv2d(channels, hyper, 3, 2, 1)
        self.hs_model_2 = nn.ConvTranspose2d(hyper, 2 * channels, 4, 2, 1)
        self.v_z2_sigma = nn.Parameter(torch.ones(1, hyper, 1, 1))
        with torch.no_grad():
            self.v_z2_sigma[:, :2] = 0.0  # two hyper channels switched off (ours)
        self.register_parameter("z2_sigma", self.v_z2_sigma)
        self.entropy_bottleneck_z2 = GaussianModel()
        self.entropy_bottleneck_z3 = GaussianModel()

    def forward(self, inputs, lmbda):
        z3 = self.a_model(inputs)
        z3_noisy = z3 + torch.rand_like(z3) - 0.5
        z3_rounded = bypass_round(z3)
        z2 = self.ha_model_2(z3_rounded)
        z2_noisy = z2 + torch.rand_like(z2) - 0.5
        z2_rounded = bypass_round(z2)
        h2 = self.hs_model_2(z2_rounded)
        z2_sigma = torch.abs(self.z2_sigma)
        z2_mu = torch.zeros_like(z2_sigma)
        z2_likelihoods = self.entropy_bottleneck_z2(z2_noisy, z2_sigma, z2_mu)
        z3_mu, z3_log_sigma = h2.chunk(2, dim=1)
        z3_likelihoods = self.entropy_bottleneck_z3(z3_noisy, torch.exp(z3_log_sigma), z3_mu)
        x_tilde = self.s_model(z3_rounded)
        num_pixels = inputs.size()[0] * inputs.size()[2] * inputs.size()[3]
        train_mse = torch.mean((inputs - x_tilde) ** 2, [0, 1, 2, 3]) * 255 ** 2
        bpp_list = [torch.sum(torch.log(lh), [0, 1, 2, 3]) / (-np.log(2) * num_pixels)
                    for lh in [z2_likelihoods, z3_likelihoods]]
        train_bpp = bpp_list[0] + bpp_list[1]
        train_loss = lmbda * train_mse + train_bpp
        return train_loss, train_bpp, train_mse


net = Net()
opt = torch.optim.Adam(net.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(1)
images = torch.rand(64, 3, 16, 16, generator=g)
for epoch in range(3):
    for i in range(0, 64, 8):
        x = images[i:i + 8]
        opt.zero_grad()
        train_loss, train_bpp, train_mse = net(x, lmbda=0.01)
        train_loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), 10)
        opt.step()
    grads_finite = all(math.isfinite(p.grad.abs().sum().item()) for p in net.parameters() if p.grad is not None)
    print("epoch", epoch, "loss", train_loss.item(), "bpp", train_bpp.item(), "grads finite", grads_finite)

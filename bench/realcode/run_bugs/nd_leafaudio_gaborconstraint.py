# Source: https://github.com/denfed/leaf-audio-pytorch/issues/3 (fixed by pull request #4)
# Original: denfed/leaf-audio-pytorch convolution.py (GaborConstraint, GaborConv1D) and the toy training loop;
# the impulse responses, the Gaussian pooling and the PCEN compression are cut down to a Gabor filterbank, an
# energy pooling and a linear classifier on synthetic "waveforms"
# Bug: the constraint that clips the learnable (mu, sigma) pairs of the Gabor filters runs its whole forward under
# torch.no_grad(); the clipped kernel that builds the filters is a constant, so the filterbank's parameters never
# receive a gradient and the front end never learns (only the classifier does).
import math

import torch
from torch import nn
from torch.nn import functional as F


def gabor_impulse_response(t, center, fwhm):
    denominator = 1.0 / (math.sqrt(2.0 * math.pi) * fwhm)
    gaussian = torch.exp(torch.tensordot(1.0 / (2.0 * fwhm.unsqueeze(1) ** 2), -t.unsqueeze(0) ** 2, dims=1))
    phase = torch.tensordot(center.unsqueeze(1), t.unsqueeze(0), dims=1)
    return denominator.unsqueeze(1) * gaussian * torch.cos(phase), denominator.unsqueeze(1) * gaussian * torch.sin(phase)


def gabor_filters(kernel, size):
    t = torch.arange(-(size // 2), (size + 1) // 2, dtype=kernel.dtype)
    return gabor_impulse_response(t, center=kernel[:, 0], fwhm=kernel[:, 1])


class GaborConstraint(nn.Module):
    def __init__(self, kernel_size):
        super().__init__()
        self._kernel_size = kernel_size

    def forward(self, kernel):
        with torch.no_grad():  # BUG
            mu_lower, mu_upper = 0.0, math.pi
            sigma_lower = 4 * math.sqrt(2 * math.log(2)) / math.pi
            sigma_upper = self._kernel_size * math.sqrt(2 * math.log(2)) / math.pi
            clipped_mu = torch.clamp(kernel[:, 0], mu_lower, mu_upper)
            clipped_sigma = torch.clamp(kernel[:, 1], sigma_lower, sigma_upper)
            return torch.stack([clipped_mu, clipped_sigma], dim=1)


class GaborConv1D(nn.Module):
    def __init__(self, filters, kernel_size, strides, padding):
        super().__init__()
        self._filters = filters // 2
        self._kernel_size = kernel_size
        self._strides, self._padding = strides, padding
        mu = torch.linspace(0.1, 2.8, self._filters)
        sigma = torch.full((self._filters,), 0.6 * kernel_size * math.sqrt(2 * math.log(2)) / math.pi)
        self._kernel = nn.Parameter(torch.stack([mu, sigma], dim=1))
        self._kernel_constraint = GaborConstraint(self._kernel_size)

    def forward(self, x):
        kernel = self._kernel_constraint(self._kernel)
        real, imag = gabor_filters(kernel, self._kernel_size)
        stacked = torch.stack([real, imag], dim=1).view(2 * self._filters, self._kernel_size).unsqueeze(1)
        return F.conv1d(x, stacked, stride=self._strides, padding=self._padding)


class Leaf(nn.Module):
    def __init__(self, n_filters=16, window_len=33, n_classes=4):
        super().__init__()
        self._complex_conv = GaborConv1D(2 * n_filters, window_len, strides=1, padding=window_len // 2)
        self.head = nn.Linear(n_filters, n_classes)

    def forward(self, x):
        out = self._complex_conv(x)
        energy = out.pow(2).view(x.shape[0], -1, 2, out.shape[-1]).sum(2)
        feats = torch.log1p(F.avg_pool1d(energy, 64).mean(-1))
        return self.head(feats)


torch.manual_seed(0)
model = Leaf()
opt = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.999), eps=1e-08, weight_decay=1e-6, amsgrad=True)
t = torch.arange(512) / 512.0
freqs = torch.tensor([20.0, 60.0, 110.0, 170.0])
before = model._complex_conv._kernel.detach().clone()
for step in range(60):
    labels = torch.randint(0, 4, (8,))
    x = torch.sin(2 * math.pi * freqs[labels].unsqueeze(1) * t) + 0.3 * torch.randn(8, 512)
    loss = F.cross_entropy(model(x.unsqueeze(1)), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", round(loss.item(), 4), "kernel grad", model._complex_conv._kernel.grad,
      "kernel moved", (model._complex_conv._kernel.detach() - before).abs().max().item())

# Source: https://github.com/daa233/generative-inpainting-pytorch/pull/42
# Original: daa233/generative-inpainting-pytorch model/networks.py (ContextualAttention.forward), at ee1fd75
# Bug: each background patch is normalised by max(sqrt(sum(w^2)), 1e-4); for an all-zero patch the square root's
# backward is 1/(2*sqrt(0)) = inf, multiplied by the 0 that torch.max sends to the losing branch, giving NaN
# gradients (fixed: sqrt(sum(w^2 + 1e-4))).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


def extract_image_patches(x, ksize):
    # 'same' padding, stride 1: [N, C*k*k, L]
    pad = (ksize - 1) // 2
    return F.unfold(F.pad(x, [pad, ksize - 1 - pad, pad, ksize - 1 - pad]), ksize)


class ContextualAttention(nn.Module):
    def __init__(self, ksize=3, softmax_scale=10.0):
        super().__init__()
        self.ksize = ksize
        self.softmax_scale = softmax_scale

    def forward(self, f, b, mask):
        n, c, h, w_ = b.shape
        w = extract_image_patches(b, self.ksize).view(n, c, self.ksize, self.ksize, -1).permute(0, 4, 1, 2, 3)
        m = extract_image_patches(mask, self.ksize).view(mask.shape[0], 1, self.ksize, self.ksize, -1)
        mm = (m[0].mean(dim=[0, 1, 2]) == 0.0).float().view(1, -1, 1, 1)  # patches fully outside the hole
        escape_NaN = torch.tensor([1e-4])
        y = []
        for xi, wi in zip(torch.split(f, 1, dim=0), torch.split(w, 1, dim=0)):
            wi = wi[0]  # [L, C, k, k]
            max_wi = torch.max(torch.sqrt((wi ** 2).sum(dim=[1, 2, 3], keepdim=True)), escape_NaN)  # BUG
            wi_normed = wi / max_wi
            yi = F.conv2d(F.pad(xi, [1, 1, 1, 1]), wi_normed)  # [1, L, H, W]
            yi = yi * mm
            yi = F.softmax(yi * self.softmax_scale, dim=1)
            yi = yi * mm
            yi = F.conv_transpose2d(yi, wi, padding=1)  # paste the matched patches back
            y.append(yi)
        return torch.cat(y, dim=0)


class FineGenerator(nn.Module):
    def __init__(self, ch=16):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(4, ch, 3, padding=1, bias=False), nn.ELU(),
                                 nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.ELU())
        self.attn = ContextualAttention()
        self.dec = nn.Sequential(nn.Conv2d(2 * ch, ch, 3, padding=1), nn.ReLU(), nn.Conv2d(ch, 3, 3, padding=1))

    def forward(self, x, mask):
        x_in = x * (1.0 - mask)
        feat = self.enc(torch.cat([x_in, mask.expand(x.shape[0], 1, -1, -1)], dim=1))
        att = self.attn(feat, feat, mask)
        out = self.dec(torch.cat([feat, att], dim=1))
        return x_in + out * mask


def batches(n, size=16):
    for _ in range(n):
        img = torch.rand(4, 3, size, size) * 0.5 + 0.25
        img[:, :, :5] = 0.0  # letterboxed photos: a black band at the top
        yield img


netG = FineGenerator()
optimizer = torch.optim.Adam(netG.parameters(), lr=1e-4, betas=(0.5, 0.9))
mask = torch.zeros(1, 1, 16, 16)
mask[:, :, 4:11, 5:12] = 1.0
for it, x in enumerate(batches(30)):
    x_out = netG(x, mask)
    loss = F.l1_loss(x_out * mask, x * mask) / mask.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if it % 5 == 0:
        print("iter", it, "l1", loss.item())

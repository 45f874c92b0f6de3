"""GAN super-resolution model whose discriminator is put in eval mode for the generator pass and never back.

Source: https://github.com/neosr-project/neosr/commit/fd9283ad09cb12cef66b6c8fa8b67a20b20389bc
("fix: I'm just a fool"), read at its parent 8e39c7ea51eca0b7b5d3dadb1b68529671c83fdf
(neosr/models/image.py: init_training_settings, closure, optimize_parameters;
neosr/archs/unet_arch.py: the spectral-norm U-Net discriminator `unet`).

Theirs: the shape of `image` (nets set to train once in init_training_settings, the accumulation
counter, the generator pass with `self.net_d.eval()` in the GAN-loss branch, the discriminator
update that follows in the same closure, the GradScaler calls, optimize_parameters), and the
`unet` discriminator (num_feat 64 -> 16 here). Ours: a two-layer generator instead of their
registry-built network, only the pixel (L1) and GAN losses out of their dozen, a BCE-with-logits
GANLoss written for this file, AdamW with lr 1e-4, random 32x32 patches, 8 iterations, CPU
(GradScaler disabled as with use_amp off), no EMA, no SAM, no eco/wavelet options.

The bug: closure() calls self.net_d.eval() before the generator's adversarial forward and nothing
calls self.net_d.train() again (init_training_settings did it once), so from the first iteration
on the discriminator is updated in eval mode; with spectral norm this stops the power iteration,
so the normalising sigma stays at its first estimate while the weights move. The fix adds
self.net_d.train() right after the generator's discriminator forward.
"""
from collections import OrderedDict

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import spectral_norm


class unet(nn.Module):
    """Defines a U-Net discriminator with spectral normalization (SN)."""

    def __init__(self, num_in_ch=3, num_feat=64, skip_connection=True) -> None:
        super().__init__()
        self.skip_connection = skip_connection
        norm = spectral_norm
        # the first convolution
        self.conv0 = nn.Conv2d(num_in_ch, num_feat, kernel_size=3, stride=1, padding=1)
        # downsample
        self.conv1 = norm(nn.Conv2d(num_feat, num_feat * 2, 4, 2, 1, bias=False))
        self.conv2 = norm(nn.Conv2d(num_feat * 2, num_feat * 4, 4, 2, 1, bias=False))
        self.conv3 = norm(nn.Conv2d(num_feat * 4, num_feat * 8, 4, 2, 1, bias=False))
        # upsample
        self.conv4 = norm(nn.Conv2d(num_feat * 8, num_feat * 4, 3, 1, 1, bias=False))
        self.conv5 = norm(nn.Conv2d(num_feat * 4, num_feat * 2, 3, 1, 1, bias=False))
        self.conv6 = norm(nn.Conv2d(num_feat * 2, num_feat, 3, 1, 1, bias=False))
        # extra convolutions
        self.conv7 = norm(nn.Conv2d(num_feat, num_feat, 3, 1, 1, bias=False))
        self.conv8 = norm(nn.Conv2d(num_feat, num_feat, 3, 1, 1, bias=False))
        self.conv9 = nn.Conv2d(num_feat, 1, 3, 1, 1)

    def forward(self, x):
        # downsample
        x0 = F.leaky_relu(self.conv0(x), negative_slope=0.2, inplace=True)
        x1 = F.leaky_relu(self.conv1(x0), negative_slope=0.2, inplace=True)
        x2 = F.leaky_relu(self.conv2(x1), negative_slope=0.2, inplace=True)
        x3 = F.leaky_relu(self.conv3(x2), negative_slope=0.2, inplace=True)
        # upsample
        x3 = F.interpolate(x3, scale_factor=2, mode="bilinear", align_corners=False)
        x4 = F.leaky_relu(self.conv4(x3), negative_slope=0.2, inplace=True)
        if self.skip_connection:
            x4 = x4 + x2
        x4 = F.interpolate(x4, scale_factor=2, mode="bilinear", align_corners=False)
        x5 = F.leaky_relu(self.conv5(x4), negative_slope=0.2, inplace=True)
        if self.skip_connection:
            x5 = x5 + x1
        x5 = F.interpolate(x5, scale_factor=2, mode="bilinear", align_corners=False)
        x6 = F.leaky_relu(self.conv6(x5), negative_slope=0.2, inplace=True)
        if self.skip_connection:
            x6 = x6 + x0
        # extra convolutions
        out = F.leaky_relu(self.conv7(x6), negative_slope=0.2, inplace=True)
        out = F.leaky_relu(self.conv8(out), negative_slope=0.2, inplace=True)
        return self.conv9(out)


class GANLoss(nn.Module):
    """Vanilla GAN loss on logits (ours, standing in for neosr's gan_loss)."""

    def forward(self, pred, target_is_real, is_disc=False):
        target = torch.ones_like(pred) if target_is_real else torch.zeros_like(pred)
        return F.binary_cross_entropy_with_logits(pred, target)


class image:
    def __init__(self, opt: dict) -> None:
        self.opt = opt
        self.net_g = nn.Sequential(
            nn.Conv2d(3, 32, 3, 1, 1), nn.LeakyReLU(0.2), nn.Conv2d(32, 3, 3, 1, 1), nn.Sigmoid())
        self.net_d = unet(num_in_ch=3, num_feat=16)
        self.init_training_settings()

    def init_training_settings(self) -> None:
        self.ema = self.opt["train"].get("ema", -1)
        self.accum_iters = self.opt["train"].get("accumulate", 1)
        self.n_accumulated = 0
        self.sam = None
        self.sam_init = -1
        self.cri_pix = nn.L1Loss()
        self.cri_gan = GANLoss()
        self.optimizer_g = torch.optim.AdamW(self.net_g.parameters(), lr=1e-4)
        self.optimizer_d = torch.optim.AdamW(self.net_d.parameters(), lr=1e-4)

        # set nets to training mode
        self.net_g.train()
        if self.net_d is not None:
            self.net_d.train()

        self.use_amp = self.opt.get("use_amp", False) is True
        self.gradscaler_g = torch.amp.GradScaler("cpu", enabled=self.use_amp, init_scale=2.0**5)
        if self.net_d is not None:
            self.gradscaler_d = torch.amp.GradScaler("cpu", enabled=self.use_amp)

    def feed_data(self, data: dict) -> None:
        self.lq = data["lq"]
        self.gt = data["gt"]

    def closure(self, current_iter: int):
        if self.net_d is not None:
            for p in self.net_d.parameters():
                p.requires_grad = False

        self.output = self.net_g(self.lq)
        self.output = torch.clamp(self.output, 1 / 255, 1)

        l_g_total = torch.zeros(1)
        loss_dict = OrderedDict()
        # pixel loss
        if self.cri_pix:
            l_g_pix = self.cri_pix(self.output, self.gt)
            l_g_total += l_g_pix
            loss_dict["l_g_pix"] = l_g_pix
        # gan loss
        if self.cri_gan:
            if self.ema > 0:
                self.net_d_ema.eval()
                fake_g_pred = self.net_d_ema(self.output)
            else:
                self.net_d.eval()  # BUG
                fake_g_pred = self.net_d(self.output)
            l_g_gan = self.cri_gan(fake_g_pred, target_is_real=True, is_disc=False)
            l_g_total += l_g_gan
            loss_dict["l_g_gan"] = l_g_gan

        loss_dict["l_g_total"] = l_g_total
        # divide losses by accumulation factor
        l_g_total /= self.accum_iters
        # backward generator
        self.gradscaler_g.scale(l_g_total).backward()

        # optimize net_d
        if self.net_d is not None:
            for p in self.net_d.parameters():
                p.requires_grad = True
            if self.cri_gan:
                # real
                real_d_pred = self.net_d(self.gt)
                l_d_real = self.cri_gan(real_d_pred, target_is_real=True, is_disc=True)
                l_d_real /= self.accum_iters
                loss_dict["l_d_real"] = l_d_real
                # fake
                fake_d_pred = self.net_d(self.output.detach())
                l_d_fake = self.cri_gan(fake_d_pred, target_is_real=False, is_disc=True)
                l_d_fake /= self.accum_iters
                loss_dict["l_d_fake"] = l_d_fake
                # backward discriminator
                self.gradscaler_d.scale(l_d_real).backward()
                self.gradscaler_d.scale(l_d_fake).backward()

        self.log_dict = {k: float(v.detach()) for k, v in loss_dict.items()}
        return l_g_total

    def optimize_parameters(self, current_iter: int) -> None:
        # increment accumulation counter
        self.n_accumulated += 1
        # reset accumulation counter
        if self.n_accumulated >= self.accum_iters:
            self.n_accumulated = 0

        # run forward-backward
        self.closure(current_iter)

        if (self.n_accumulated) % self.accum_iters == 0:
            # step() for generator
            self.gradscaler_g.step(self.optimizer_g)
            # step() for discriminator
            if self.net_d is not None:
                self.gradscaler_d.step(self.optimizer_d)
            # update gradscaler
            self.gradscaler_g.update()
            if self.net_d is not None:
                self.gradscaler_d.update()
            self.optimizer_g.zero_grad(set_to_none=True)
            # zero discriminator grads
            if self.net_d is not None:
                self.optimizer_d.zero_grad(set_to_none=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    opt = {"train": {"ema": -1, "accumulate": 1}, "use_amp": False}
    model = image(opt)
    for current_iter in range(1, 9):
        gt = torch.rand(4, 3, 32, 32)
        lq = (gt + 0.1 * torch.randn_like(gt)).clamp(0, 1)
        model.feed_data({"lq": lq, "gt": gt})
        model.optimize_parameters(current_iter)
        if current_iter % 4 == 0:
            print(current_iter, model.log_dict)

"""A small UNet-style denoiser (GroupNorm, SiLU, upsampling, skip connections), AdamW, bf16 option."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--amp", choices=["none", "bf16"], default="none")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU())


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down1, self.down2, self.down3 = block(3, 64), block(64, 128), block(128, 256)
        self.mid = block(256, 256)
        self.up3, self.up2, self.up1 = block(512, 128), block(256, 64), block(128, 64)
        self.out = nn.Conv2d(64, 3, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.avg_pool2d(d1, 2))
        d3 = self.down3(F.avg_pool2d(d2, 2))
        m = self.mid(F.avg_pool2d(d3, 2))
        u3 = self.up3(torch.cat([F.interpolate(m, scale_factor=2), d3], 1))
        u2 = self.up2(torch.cat([F.interpolate(u3, scale_factor=2), d2], 1))
        u1 = self.up1(torch.cat([F.interpolate(u2, scale_factor=2), d1], 1))
        return self.out(u1)


model = UNet().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
for step in range(args.steps):
    clean = torch.randn(args.batch_size, 3, 128, 128, device=device)
    noise = torch.randn_like(clean)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
        loss = F.mse_loss(model(clean + noise), noise)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(step, loss.item())

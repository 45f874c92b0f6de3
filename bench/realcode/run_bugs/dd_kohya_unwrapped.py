# Source: https://github.com/kohya-ss/sd-scripts/pull/604
# Original: kohya-ss/sd-scripts fine_tune.py
# Bug: after accelerator.prepare wraps the UNet in DDP, the script unwraps it again and calls forward and
# backward on the unwrapped module: no gradient all-reduce happens, each rank trains its own diverging copy.
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
unet = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(16, 4, 3, padding=1))
optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4)
unet = DDP(unet)                      # accelerator.prepare(unet, optimizer, ...)
unet = unet.module  # BUG
g = torch.Generator().manual_seed(rank)
for epoch in range(2):
    unet.train()
    for step in range(15):
        latents = torch.randn(2, 4, 8, 8, generator=g)
        noise = torch.randn(latents.shape, generator=g)
        noise_pred = unet(latents + noise)
        loss = F.mse_loss(noise_pred.float(), noise.float(), reduction="mean")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
dist.destroy_process_group()

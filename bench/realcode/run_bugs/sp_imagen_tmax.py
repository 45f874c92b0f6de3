# Source: https://github.com/lucidrains/imagen-pytorch/issues/71 (fixed in commit 2fa74ed)
# Original: lucidrains/imagen-pytorch imagen_pytorch/trainer.py (ImagenTrainer.__init__ / update)
# Bug: the unet's CosineAnnealingLR gets T_max=unet_warmup_steps instead of the cosine decay length, while
# the scheduler is stepped after every update: the learning rate reaches its minimum at the end of the
# warm-up and then cycles up and down for the rest of training.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
unet = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(8, 3, 3, padding=1))
lr, warmup_steps, cosine_decay_max_steps = 1e-4, 10, 200
optimizer = torch.optim.Adam(unet.parameters(), lr=lr, betas=(0.9, 0.99))
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=warmup_steps)  # BUG


def update():
    torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


for step in range(120):
    images = torch.randn(4, 3, 16, 16)
    noise = torch.randn_like(images)
    loss = F.mse_loss(unet(images + noise), noise)
    loss.backward()
    update()
print("done")

# Source: https://github.com/victorchall/EveryDream2trainer/pull/175
# Original: victorchall/EveryDream2trainer train.py (main's step loop, --clip_grad_norm with AMP and --grad_accum)
# Bug: with AMP the loss is scaled before backward and --clip_grad_norm is applied right after it, to the scaled
# gradients, so the threshold is compared with norms multiplied by the (dynamic) loss scale and clipping all but
# stops training; the PR unscales before clipping.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class TinyUNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.down = torch.nn.Conv2d(4, 16, 3, padding=1)
        self.mid = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.up = torch.nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, latents, timesteps):
        h = F.silu(self.down(latents)) + timesteps.view(-1, 1, 1, 1) / 1000
        return self.up(F.silu(self.mid(h)))


def get_model_prediction_and_target(unet, latents):
    noise = torch.randn_like(latents)
    timesteps = torch.randint(0, 1000, (latents.shape[0],)).float()
    noisy = latents + noise * (timesteps.view(-1, 1, 1, 1) / 1000)
    with torch.autocast("cpu", dtype=torch.float16):
        model_pred = unet(noisy, timesteps)
    return model_pred.float(), noise


unet = TinyUNet()
optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu", init_scale=2**17.5, growth_interval=25)
grad_accum, clip_grad_norm = 2, 1.0
epoch_len = 16
for epoch in range(3):
    for step in range(epoch_len):
        latents = torch.randn(4, 4, 8, 8)
        model_pred, target = get_model_prediction_and_target(unet, latents)
        loss = F.mse_loss(model_pred, target, reduction="mean")
        scaler.scale(loss).backward()
        if clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(parameters=unet.parameters(), max_norm=clip_grad_norm)  # BUG
        if ((step + 1) % grad_accum == 0) or (step == epoch_len - 1):
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    print("epoch", epoch, "loss", round(loss.item(), 4))

"""Source: https://github.com/hpcaitech/Open-Sora/commit/91ccddc01caeeb7a70304c11fc4c42a4237fc9cf
("Force fp16 input to fp32 to avoid nan output in timestep_transform"). Read: opensora/schedulers/rf/
rectified_flow.py (timestep_transform, RFlowScheduler.training_losses and add_noise), opensora/schedulers/iddpm/
gaussian_diffusion.py (mean_flat) and scripts/train.py (the step loop) at the fix's parent (91ccddc^).

Bug: train.py moves every tensor of the batch to the training dtype (`model_args[k] = v.to(device, dtype)`),
so with `dtype = "fp16"` the bucket's height, width and num_frames become float16. timestep_transform then
multiplies height by width in float16: any resolution above 65504 pixels (480x854 here) overflows to inf, the
ratio becomes inf and `ratio * t / (1 + (ratio - 1) * t)` is inf/inf = NaN, so the noised input and the loss are
NaN for every batch of such a bucket. The fix casts the three entries to float32 before the transform.

Theirs: timestep_transform, training_losses (uniform t, use_timestep_transform on, add_noise, the velocity
target, mean_flat) and add_noise verbatim; the step loop's shape (x and every batch entry cast to dtype, loss
mean, backward, step). Ours: a tiny 3-D conv velocity model instead of STDiT, random latents, two buckets
(144x256, under the float16 limit, and 480x854), the fp16 model trained by plain AdamW instead of ColossalAI's
booster, no text encoder, VAE or masks.
"""
import torch
from torch import nn

torch.manual_seed(0)


def mean_flat(tensor: torch.Tensor, mask=None):
    return tensor.mean(dim=list(range(1, len(tensor.shape))))


def timestep_transform(
    t,
    model_kwargs,
    base_resolution=512 * 512,
    base_num_frames=1,
    scale=1.0,
    num_timesteps=1,
):
    t = t / num_timesteps
    resolution = model_kwargs["height"] * model_kwargs["width"]  # BUG
    ratio_space = (resolution / base_resolution).sqrt()
    if model_kwargs["num_frames"][0] == 1:
        num_frames = torch.ones_like(model_kwargs["num_frames"])
    else:
        num_frames = model_kwargs["num_frames"] // 17 * 5
    ratio_time = (num_frames / base_num_frames).sqrt()

    ratio = ratio_space * ratio_time * scale
    new_t = ratio * t / (1 + (ratio - 1) * t)

    new_t = new_t * num_timesteps
    return new_t


class RFlowScheduler:
    def __init__(self, num_timesteps=1000, use_timestep_transform=True, transform_scale=1.0):
        self.num_timesteps = num_timesteps
        self.use_timestep_transform = use_timestep_transform
        self.transform_scale = transform_scale

    def training_losses(self, model, x_start, model_kwargs=None, noise=None, mask=None, weights=None, t=None):
        if t is None:
            t = torch.rand((x_start.shape[0],), device=x_start.device) * self.num_timesteps
            if self.use_timestep_transform:
                t = timestep_transform(t, model_kwargs, scale=self.transform_scale, num_timesteps=self.num_timesteps)
        if noise is None:
            noise = torch.randn_like(x_start)
        x_t = self.add_noise(x_start, noise, t)
        terms = {}
        model_output = model(x_t, t, **model_kwargs)
        velocity_pred = model_output.chunk(2, dim=1)[0]
        loss = mean_flat((velocity_pred - (x_start - noise)).pow(2), mask=mask)
        terms["loss"] = loss
        return terms

    def add_noise(self, original_samples, noise, timesteps):
        timepoints = timesteps.float() / self.num_timesteps
        timepoints = 1 - timepoints  # [1,1/1000]
        timepoints = timepoints.unsqueeze(1).unsqueeze(1).unsqueeze(1).unsqueeze(1)
        timepoints = timepoints.repeat(1, noise.shape[1], noise.shape[2], noise.shape[3], noise.shape[4])
        return timepoints * original_samples + (1 - timepoints) * noise


class TinySTDiT(nn.Module):
    def __init__(self, in_channels=4):
        super().__init__()
        self.t_embed = nn.Linear(1, 16)
        self.conv_in = nn.Conv3d(in_channels, 16, 3, padding=1)
        self.conv_out = nn.Conv3d(16, 2 * in_channels, 3, padding=1)

    def forward(self, x, timestep, height=None, width=None, num_frames=None, fps=None):
        dtype = self.conv_in.weight.dtype
        x = x.to(dtype)
        temb = self.t_embed((timestep / 1000).to(dtype).unsqueeze(1))[:, :, None, None, None]
        return self.conv_out(torch.nn.functional.silu(self.conv_in(x) + temb))


device, dtype = torch.device("cpu"), torch.float16
model = TinySTDiT().to(device, dtype)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-4)
scheduler = RFlowScheduler()
buckets = [(144, 256), (480, 854)]
running_loss = 0.0
for step in range(12):
    h, w = buckets[step % 2] if step >= 4 else buckets[0]
    batch = {
        "video": torch.randn(2, 4, 2, h // 16, w // 16),
        "height": torch.full((2,), float(h)),
        "width": torch.full((2,), float(w)),
        "num_frames": torch.full((2,), 1.0),
        "fps": torch.full((2,), 24.0),
    }
    x = batch.pop("video").to(device, dtype)  # [B, C, T, H, W]
    model_args = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            model_args[k] = v.to(device, dtype)
    loss_dict = scheduler.training_losses(model, x, model_args)
    loss = loss_dict["loss"].mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    running_loss += loss.item()
    print("step", step, f"{h}x{w}", "loss", loss.item())

"""Dreambooth trainer that re-caches its latents into a new prepared DataLoader after every epoch.

Source: https://github.com/d8ahazard/sd_dreambooth_extension/commit/b6aff95a9ae9209ce7e8b7b9d81f99e350c83c4e
("Fix mem leak"), read at its parent b6aff95^ (dreambooth/train_dreambooth.py: main's
cache_latents closure, LatentsDataset, the epoch loop and the re-cache after each epoch).

Theirs: cache_latents (a plain DataLoader over the image dataset, every batch encoded by the VAE
and the text encoder under no_grad, the results wrapped in a LatentsDataset and handed to
`accelerator.prepare(DataLoader(dataset, batch_size=1, collate_fn=lambda z: z, shuffle=True))`),
the training step's shape (latent_dist.sample() * 0.18215, noise, timesteps, noisy latents,
unet(noisy_latents, timesteps, encoder_hidden_states).sample, MSE, accelerator.backward,
optimizer/scheduler step, zero_grad) and `train_dataset, train_dataloader = cache_latents(...)`
at the end of every epoch. Ours: a one-conv "VAE" returning a diagonal Gaussian, an embedding
"text encoder", a small conv "UNet" with a time/text bias, a linear noise schedule instead of
diffusers' DDPMScheduler (not installed), 16 random 3x128x128 images and 8-token prompts,
5 epochs, a constant LambdaLR, no prior preservation, no EMA/LoRA/previews, CPU.

The bug: every call of cache_latents builds a new LatentsDataset holding every image's latent
distribution and text embedding, and accelerator.prepare() appends the new DataLoader to the
Accelerator's internal `_dataloaders` list, which never drops the old ones: each epoch keeps one
more full copy of the cached latents alive (and re-encodes the whole data set). The fix empties
`accelerator._dataloaders` and calls prepare_data_loader instead.
"""
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import Dataset


class DiagonalGaussian:
    def __init__(self, mean, logvar):
        self.mean = mean
        self.std = torch.exp(0.5 * logvar)

    def sample(self):
        return self.mean + self.std * torch.randn_like(self.mean)


class TinyVAE(nn.Module):
    class Output:
        def __init__(self, latent_dist):
            self.latent_dist = latent_dist

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 4, stride=2, padding=1)

    def encode(self, x):
        mean, logvar = self.conv(x).chunk(2, dim=1)
        return self.Output(DiagonalGaussian(mean, logvar))


class TinyUNet(nn.Module):
    class Output:
        def __init__(self, sample):
            self.sample = sample

    def __init__(self, dim=32):
        super().__init__()
        self.inp = nn.Conv2d(4, dim, 3, padding=1)
        self.cond = nn.Linear(dim, dim)
        self.out = nn.Conv2d(dim, 4, 3, padding=1)

    def forward(self, x, timesteps, encoder_hidden_states):
        h = self.inp(x) + self.cond(encoder_hidden_states.mean(1))[:, :, None, None]
        h = h + (timesteps.float() / 1000)[:, None, None, None]
        return self.Output(self.out(F.silu(h)))


class ImageDataset(Dataset):
    def __init__(self, n=16):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, 128, 128, generator=g) * 2 - 1
        self.ids = torch.randint(0, 100, (n, 8), generator=g)
        self.current_concept = 0

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"pixel_values": self.images[i], "input_ids": self.ids[i]}


def collate_fn(examples):
    return {"pixel_values": torch.stack([e["pixel_values"] for e in examples]),
            "input_ids": torch.stack([e["input_ids"] for e in examples])}


class LatentsDataset(Dataset):
    def __init__(self, latents_cache, text_encoder_cache, concepts_cache):
        self.latents_cache = latents_cache
        self.text_encoder_cache = text_encoder_cache
        self.concepts_cache = concepts_cache
        self.current_index = 0
        self.current_concept = 0

    def __len__(self):
        return len(self.latents_cache)

    def __getitem__(self, index):
        self.current_concept = self.concepts_cache[index]
        return self.latents_cache[index], self.text_encoder_cache[index]


def main(num_train_epochs=5, train_batch_size=1):
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    vae = TinyVAE()
    text_encoder = nn.Embedding(100, 32)
    unet = TinyUNet()
    vae.requires_grad_(False)
    text_encoder.requires_grad_(False)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    num_train_timesteps = 1000
    alphas_cumprod = torch.cumprod(1 - torch.linspace(1e-4, 0.02, num_train_timesteps), 0)

    def add_noise(latents, noise, timesteps):
        a = alphas_cumprod[timesteps][:, None, None, None]
        return a.sqrt() * latents + (1 - a).sqrt() * noise

    train_dataset = ImageDataset()

    def cache_latents(td=None, tdl=None, enc_vae=None, orig_dataset=None):
        if td is not None:
            del td
        if tdl is not None:
            del tdl
        dataset = orig_dataset
        dataloader = torch.utils.data.DataLoader(
            dataset, batch_size=train_batch_size, shuffle=True, collate_fn=collate_fn
        )
        latents_cache = []
        text_encoder_cache = []
        concepts_cache = []
        for d_batch in dataloader:
            with torch.no_grad():
                d_batch["pixel_values"] = d_batch["pixel_values"].to(accelerator.device)
                d_batch["input_ids"] = d_batch["input_ids"].to(accelerator.device)
                latents_cache.append(enc_vae.encode(d_batch["pixel_values"]).latent_dist)
                text_encoder_cache.append(text_encoder(d_batch["input_ids"]))
                concepts_cache.append(dataset.current_concept)
        dataset = LatentsDataset(latents_cache, text_encoder_cache, concepts_cache)
        dataloader = accelerator.prepare(torch.utils.data.DataLoader(dataset, batch_size=1, collate_fn=lambda z: z, shuffle=True))  # BUG
        return dataset, dataloader

    # Store our original uncached dataset for preview generation
    gen_dataset = train_dataset
    train_dataset, train_dataloader = cache_latents(enc_vae=vae, orig_dataset=gen_dataset)
    unet, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        unet, optimizer, train_dataloader, lr_scheduler)

    global_step = 0
    for epoch in range(num_train_epochs):
        unet.train()
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(unet):
                # Convert images to latent space
                with torch.no_grad():
                    latent_dist = batch[0][0]
                    latents = latent_dist.sample() * 0.18215
                # Sample noise that we'll add to the latents
                noise = torch.randn_like(latents)
                bsz = latents.shape[0]
                timesteps = torch.randint(0, num_train_timesteps, (bsz,), device=latents.device).long()
                noisy_latents = add_noise(latents, noise, timesteps)
                encoder_hidden_states = batch[0][1]
                # Predict the noise residual
                noise_pred = unet(noisy_latents, timesteps, encoder_hidden_states).sample
                loss = F.mse_loss(noise_pred.float(), noise.float(), reduction="mean")
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            global_step += train_batch_size
        print(f"epoch {epoch}: step {global_step}, loss {loss.item():.4f}")
        accelerator.wait_for_everyone()
        train_dataset, train_dataloader = cache_latents(enc_vae=vae, orig_dataset=gen_dataset)


if __name__ == "__main__":
    main()

# Source: https://github.com/Zhen-Dong/Magic-Me/issues/14
# Original: Zhen-Dong/Magic-Me, the video customization training loop (masked denoising loss); from the issue text
# Bug: the masked loss is normalised per sample by the mask's area, loss.sum([1,2,3,4]) / masks.sum([1,2,3,4]).
# A clip whose subject mask is empty (the face detector found nothing) divides 0 by 0: the loss is NaN and the
# next update fills the weights with NaN.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class TinyUNet3D(torch.nn.Module):
    def __init__(self, ch=4, hidden=16):
        super().__init__()
        self.inp = torch.nn.Conv3d(ch, hidden, 3, padding=1)
        self.mid = torch.nn.Conv3d(hidden, hidden, 3, padding=1)
        self.out = torch.nn.Conv3d(hidden, ch, 3, padding=1)

    def forward(self, x, t):
        h = F.silu(self.inp(x)) + t.view(-1, 1, 1, 1, 1)
        return self.out(F.silu(self.mid(h)))


def subject_masks(batch, frames, size, step):
    masks = torch.zeros(batch, 1, frames, size, size)
    for b in range(batch):
        if (2 * step + b) % 13 == 12:
            continue  # no face detected in this clip: an empty mask
        y, x = torch.randint(0, size - 6, (2,)).tolist()
        masks[b, :, :, y:y + 6, x:x + 6] = 1.0
    return masks


def main():
    unet = TinyUNet3D()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4)
    alphas = torch.linspace(0.99, 0.02, 100)
    for step in range(30):
        latents = torch.randn(2, 4, 4, 16, 16)
        masks = subject_masks(2, 4, 16, step)
        noise = torch.randn_like(latents)
        t = torch.randint(0, 100, (2,))
        a = alphas[t].view(-1, 1, 1, 1, 1)
        noisy = a.sqrt() * latents + (1 - a).sqrt() * noise
        model_pred = unet(noisy, t.float() / 100)
        loss = F.mse_loss(model_pred.float(), noise.float(), reduction="none")
        loss = loss * masks
        loss = loss.sum([1, 2, 3, 4]) / masks.sum([1, 2, 3, 4])  # BUG
        loss = loss.mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 5 == 0:
            print("step", step, "loss", loss.item())


main()

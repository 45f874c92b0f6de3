# Source: synthetic: state 4 of run15miss
# Original: none (our own script; a perceptual loss whose function was decorated to keep the extractor frozen)
# Bug: @torch.no_grad() on the perceptual loss cuts its term from the generator: only the pixel loss trains it.
import torch
from torch import nn

torch.manual_seed(0)
generator = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 3, 3, padding=1))
features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
for p in features.parameters():
    p.requires_grad_(False)


@torch.no_grad()  # BUG
def perceptual_loss(output, target):
    return nn.functional.mse_loss(features(output), features(target))


optimizer = torch.optim.Adam(generator.parameters(), lr=1e-3)
for step in range(40):
    low, high = torch.randn(4, 3, 16, 16), torch.randn(4, 3, 16, 16)
    output = generator(low)
    loss = nn.functional.l1_loss(output, high) + 0.1 * perceptual_loss(output, high)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done", loss.item())

"""An MLP-Mixer on 64x64 images: token and channel MLPs, LayerNorm, SGD with Nesterov, bf16 autocast."""
import argparse

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"


class MixerBlock(nn.Module):
    def __init__(self, tokens, dim):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.tokens = nn.Sequential(nn.Linear(tokens, 4 * tokens), nn.GELU(), nn.Linear(4 * tokens, tokens))
        self.channels = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


model = nn.Sequential(nn.Conv2d(3, 512, 8, 8), nn.Flatten(2), *[nn.Identity()], ).to(device)
blocks = nn.Sequential(*[MixerBlock(64, 512) for _ in range(8)]).to(device)
head = nn.Linear(512, 100).to(device)
params = list(model.parameters()) + list(blocks.parameters()) + list(head.parameters())
opt = torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True)
for step in range(args.steps):
    x = torch.randn(args.batch_size, 3, 64, 64, device=device)
    y = torch.randint(0, 100, (args.batch_size,), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = blocks(model(x).transpose(1, 2))
        loss = nn.functional.cross_entropy(head(h.mean(1)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(step, loss.item())

"""A ViT-style image classifier (patch embedding, nn.TransformerEncoder, AdamW)."""
import argparse

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--amp", choices=["none", "bf16"], default="none")
p.add_argument("--ckpt", action="store_true")
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"


class ViT(nn.Module):
    def __init__(self, image=224, patch=16, dim=768, depth=12, heads=12, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.Sequential(*[layer.__class__(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                                       batch_first=True, norm_first=True) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = checkpoint_sequential(self.encoder, 4, x, use_reentrant=False) if args.ckpt else self.encoder(x)
        return self.head(self.norm(x[:, 0]))


model = ViT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05)
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
for step in range(args.steps):
    images = torch.randn(args.batch_size, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(step, round(loss.item(), 4))

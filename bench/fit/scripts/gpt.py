"""A nanoGPT-shaped decoder (SDPA causal attention, AdamW, optional bf16 and activation checkpointing)."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--amp", choices=["none", "bf16"], default="none")
p.add_argument("--ckpt", action="store_true")
p.add_argument("--layers", type=int, default=12)
p.add_argument("--dim", type=int, default=768)
p.add_argument("--block", type=int, default=1024)
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab = 50304


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab, args.dim)
        self.wpe = nn.Embedding(args.block, args.dim)
        self.blocks = nn.ModuleList(Block(args.dim, args.dim // 64) for _ in range(args.layers))
        self.ln_f = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, 0.0, 0.02 / math.sqrt(2 * args.layers))

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if args.ckpt else block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
for step in range(args.steps):
    data = torch.randint(0, vocab, (args.batch_size, args.block + 1))
    x, y = data[:, :-1].to(device), data[:, 1:].to(device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step % 10 == 0:
        print(f"iter {step}: loss {loss.item():.4f}")

# Source: https://github.com/Stability-AI/stablediffusion/pull/89
# Original: Stability-AI/stablediffusion ldm/modules/attention.py (CrossAttention.forward), before the PR
# Bug: under float16 autocast the attention logits einsum(q, k) run in half precision; with large activations a dot
# product exceeds 65504 before the scale is applied, becomes inf, and the softmax turns the row into NaN (fixed: the
# einsum runs with autocast disabled on q.float(), k.float()).
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import einsum

torch.manual_seed(0)


def rearrange_heads(t, h):  # 'b n (h d) -> (b h) n d'
    b, n, hd = t.shape
    return t.view(b, n, h, hd // h).permute(0, 2, 1, 3).reshape(b * h, n, hd // h)


class CrossAttention(nn.Module):
    def __init__(self, query_dim, context_dim=None, heads=4, dim_head=64):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = context_dim or query_dim
        self.scale = dim_head ** -0.5
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_k = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_v = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, query_dim), nn.Dropout(0.0))

    def forward(self, x, context=None):
        h = self.heads
        q = self.to_q(x)
        context = x if context is None else context
        k = self.to_k(context)
        v = self.to_v(context)
        q, k, v = (rearrange_heads(t, h) for t in (q, k, v))
        sim = einsum("b i d, b j d -> b i j", q, k) * self.scale  # BUG
        sim = sim.softmax(dim=-1)
        out = einsum("b i j, b j d -> b i d", sim, v)
        b_h, n, d = out.shape
        out = out.view(b_h // h, h, n, d).permute(0, 2, 1, 3).reshape(b_h // h, n, h * d)
        return self.to_out(out)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, context_dim):
        super().__init__()
        self.attn1 = CrossAttention(dim)
        self.attn2 = CrossAttention(dim, context_dim=context_dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x, context):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context=context) + x
        return self.ff(self.norm3(x)) + x


class TinyDenoiser(nn.Module):
    def __init__(self, ch=4, dim=64, context_dim=48):
        super().__init__()
        self.proj_in = nn.Linear(ch, dim)
        self.block = BasicTransformerBlock(dim, context_dim)
        self.proj_out = nn.Linear(dim, ch)

    def forward(self, latents, context):
        b, c, hh, ww = latents.shape
        x = self.proj_in(latents.flatten(2).transpose(1, 2))
        x = self.block(x, context)
        return self.proj_out(x).transpose(1, 2).view(b, c, hh, ww)


model = TinyDenoiser()
with torch.no_grad():  # stand-in for a trained checkpoint whose cross-attention inputs are large (ours)
    model.block.norm2.weight.fill_(100.0)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu")
for step in range(12):
    latents = torch.randn(4, 4, 8, 8)
    # un-normalised text-encoder states: large activations, as in the deep layers the PR was written for
    context = 100.0 * torch.randn(4, 16, 48)
    noise = torch.randn_like(latents)
    t = torch.rand(4, 1, 1, 1)
    noisy = (1 - t) * latents + t * noise
    with torch.autocast("cpu", dtype=torch.float16):
        pred = model(noisy, context)
        loss = F.mse_loss(pred.float(), noise)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(f"step {step} loss {loss.item():.4f} scale {scaler.get_scale():.0f}")

# Source: https://github.com/facebookresearch/xformers/issues/96 (fixed by PR #98, commit ba38f9c)
# Original: facebookresearch/xformers xformers/components/attention/favor.py (FavorAttention.forward) and
# feature_maps/softmax.py (SoftMaxPositiveEstimators.pre_scale, SMOrf), at ba38f9c^
# Bug: under fp16 autocast the Performer feature maps come out in float16; for queries and keys of norm ~20 the
# positive random features are tiny, and the normalisation q' @ (k'^T @ 1) underflows to 0, so att_raw /
# att_normalization is 0/0 and the loss is nan from the first step ("The loss nans immediately"). The fix runs these
# contractions in fp32 with autocast off.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
VOCAB, D_MODEL, HEADS, SEQ = 32, 32, 1, 16


class SMOrf(nn.Module):
    """Positive orthogonal random features for the softmax kernel (Performers, Lemma 1)."""

    def __init__(self, dim_features, epsilon=1e-6):
        super().__init__()
        self.dim_features, self.epsilon = dim_features, epsilon
        self.h_scale = math.log(math.sqrt(dim_features))
        self.features = None

    @torch.no_grad()
    def _get_feature_map(self, dim_input):
        blocks = math.ceil(dim_input / self.dim_features)
        H = torch.randn(blocks, self.dim_features, self.dim_features)
        norms = torch.sqrt(torch.einsum("...d,...d->...", H, H))
        Q, R = torch.linalg.qr(H)
        Q = torch.diag_embed(torch.sign(torch.diagonal(R, dim1=1, dim2=2))) @ Q
        return (torch.diag_embed(norms) @ Q).flatten(0, 1)[:dim_input]

    def forward(self, x):
        if self.features is None:
            self.features = self._get_feature_map(x.shape[-1])
        features = self.features.to(x.dtype)
        x_scaled = x * x.shape[-1] ** -0.25
        norm_x_2 = torch.einsum("...d,...d->...", x_scaled, x_scaled).unsqueeze(-1)
        offset = -0.5 * norm_x_2 - self.h_scale + self.epsilon
        return torch.exp(x_scaled @ features + offset)


class FavorAttention(nn.Module):
    def __init__(self, dim_head, dim_features=32, dropout=0.0):
        super().__init__()
        self.attn_drop = nn.Dropout(dropout, inplace=False)
        self.feature_map_query = SMOrf(dim_features)
        self.feature_map_key = SMOrf(dim_features)

    def forward(self, q, k, v):
        k_prime = self.feature_map_key(k)
        q_prime = self.feature_map_query(q)
        att_normalization = q_prime @ (k_prime.transpose(-2, -1) @ torch.ones_like(v))  # BUG
        att_raw = q_prime @ (k_prime.transpose(-2, -1) @ v)
        att = att_raw / att_normalization
        return self.attn_drop(att)


class Block(nn.Module):
    """Post-LN encoder block (as in the original Transformer): attention sees the raw residual stream."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.attention = FavorAttention(D_MODEL // HEADS)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x):
        B, L, _ = x.shape
        q, k, v = self.qkv(x).split(D_MODEL, dim=-1)
        q, k, v = (t.reshape(B, L, HEADS, -1).transpose(1, 2).reshape(B * HEADS, L, -1) for t in (q, k, v))
        y = self.attention(q, k, v).reshape(B, HEADS, L, -1).transpose(1, 2).reshape(B, L, D_MODEL)
        x = self.ln1(x + self.proj(y))
        return self.ln2(x + self.mlp(x))


class MaskedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB + 1, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.blocks = nn.Sequential(Block())
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, idx):
        x = self.tok(idx) * math.sqrt(D_MODEL) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.blocks(x))


def batch(n=8):
    """Arithmetic sequences mod VOCAB; 15% of the tokens masked (id VOCAB) and predicted."""
    start, step = torch.randint(0, VOCAB, (n, 1)), torch.randint(1, 4, (n, 1))
    seq = (start + step * torch.arange(SEQ)) % VOCAB
    masked = torch.rand(n, SEQ) < 0.15
    return seq.masked_fill(masked, VOCAB), seq.masked_fill(~masked, -100)


model = MaskedLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
scaler = torch.amp.GradScaler("cpu")
for step in range(12):
    inputs, targets = batch()
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1), ignore_index=-100)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    if step % 4 == 0:
        print(f"step {step} loss {loss.item():.4f} scale {scaler.get_scale():.0f}")

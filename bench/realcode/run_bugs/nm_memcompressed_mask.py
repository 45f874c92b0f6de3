# Source: https://github.com/lucidrains/memory-compressed-attention/issues/2
# Original: lucidrains/memory-compressed-attention memory_compressed_attention/memory_compressed_attention.py
# (MemoryCompressedAttention.forward, the causal mask)
# Bug: the causal mask fills the future positions with -float('-inf'), which is +inf: the softmax over a row that
# holds +inf is inf/inf = nan, and the loss is nan from the first step (the fix fills float('-inf')).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class MemoryCompressedAttention(torch.nn.Module):
    def __init__(self, dim, heads=4, causal=True):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.scale = (dim // heads) ** -0.5
        self.to_qkv = torch.nn.Linear(dim, dim * 3, bias=False)
        self.to_out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool).triu_(1)
            dots = dots.masked_fill(mask, -float("-inf"))  # BUG
        attn = dots.softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", attn, v).transpose(1, 2).reshape(b, t, d)
        return self.to_out(out)


class LM(torch.nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.attn = MemoryCompressedAttention(dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        return self.head(x + self.attn(x))


vocab = 64
model = LM(vocab, 32)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(20):
    tokens = torch.randint(0, vocab, (4, 17))
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print("step", step, "loss", loss.item())

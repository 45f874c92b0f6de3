# Source: https://github.com/lucidrains/compressive-transformer-pytorch/issues/5 (fixed by commit d34aab1, "make sure
# auxiliary loss actually optimizes the compression net")
# Original: lucidrains/compressive-transformer-pytorch compressive_transformer_pytorch.py (SelfAttention.forward,
# ConvCompress, CompressiveTransformer.forward) and autoregressive_wrapper.py, read at a73d146; trimmed to one
# memory layer, no positional bias, no masks, no GRU gating; examples/enwik8_simple/train.py's loop
# Bug: the attention-reconstruction loss that should train the memory compression conv detaches the compressed
# memory's keys and values together with the targets, and the memories are detached between segments, so no
# gradient ever reaches ConvCompress: the compression net keeps its random initial weights for the whole run.
import math
from collections import namedtuple
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

Memory = namedtuple("Memory", ["mem", "compressed_mem"])
Return = namedtuple("Return", ["loss", "aux_loss", "is_last"])


def queue_fifo(*args, length, dim=-2):
    queue = torch.cat(args, dim=dim)
    if length > 0:
        return queue[:, :-length], queue[:, -length:]
    return queue, torch.empty(0)


def full_attn(q, k, v, dropout_fn=None):
    *_, dim = q.shape
    dots = torch.einsum("bhid,bhjd->bhij", q, k) * (dim**-0.5)
    attn = dots.softmax(dim=-1)
    if dropout_fn is not None:
        attn = dropout_fn(attn)
    return torch.einsum("bhij,bhjd->bhid", attn, v)


class ConvCompress(nn.Module):
    def __init__(self, dim, ratio=4):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, ratio, stride=ratio)

    def forward(self, mem):
        return self.conv(mem.transpose(1, 2)).transpose(1, 2)


class SelfAttention(nn.Module):
    def __init__(self, dim, seq_len, mem_len, cmem_len, cmem_ratio=4, heads=2, reconstruction_attn_dropout=0.0):
        super().__init__()
        self.heads = heads
        self.dim_head = dim // heads
        self.seq_len, self.mem_len, self.cmem_len, self.cmem_ratio = seq_len, mem_len, cmem_len, cmem_ratio
        self.compress_mem_fn = ConvCompress(dim, cmem_ratio)
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_kv = nn.Linear(dim, dim * 2, bias=False)
        self.to_out = nn.Linear(dim, dim)
        self.reconstruction_attn_dropout = nn.Dropout(reconstruction_attn_dropout)

    def forward(self, x, memories=None):
        b, t, e, h = *x.shape, self.heads
        mem, cmem = memories
        mem_len, cmem_len = mem.shape[1], cmem.shape[1]
        q = self.to_q(x)
        kv_input = torch.cat((cmem, mem, x), dim=1)
        k, v = self.to_kv(kv_input).chunk(2, dim=-1)
        merge_heads = lambda z: z.reshape(b, -1, h, self.dim_head).transpose(1, 2)  # noqa: E731
        q, k, v = map(merge_heads, (q, k, v))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * self.dim_head**-0.5
        total_mem_len = mem_len + cmem_len
        causal = torch.ones(t, t + total_mem_len).triu_(diagonal=1 + total_mem_len).bool()
        dots.masked_fill_(causal[None, None], -torch.finfo(dots.dtype).max)
        out = torch.einsum("bhij,bhjd->bhid", dots.softmax(dim=-1), v)
        logits = self.to_out(out.transpose(1, 2).reshape(b, t, -1))

        aux_loss = torch.zeros(1, requires_grad=True)
        old_mem, new_mem = queue_fifo(mem, x, length=self.mem_len, dim=1)
        if old_mem.shape[1] == 0 or self.cmem_len <= 0:
            return logits, Memory(new_mem, cmem), aux_loss
        compressed_mem = self.compress_mem_fn(old_mem)
        new_cmem = torch.cat((cmem, compressed_mem), dim=1)[:, -self.cmem_len:]
        if not self.training:
            return logits, Memory(new_mem, new_cmem), aux_loss

        # calculate compressed memory auxiliary loss if training
        cmem_k, cmem_v = self.to_kv(compressed_mem).chunk(2, dim=-1)
        cmem_k, cmem_v = map(merge_heads, (cmem_k, cmem_v))
        old_mem_range = slice(-min(mem_len, self.mem_len) - self.seq_len, -self.seq_len)
        old_mem_k, old_mem_v = map(lambda z: z[:, :, old_mem_range].clone(), (k, v))
        q, old_mem_k, old_mem_v, cmem_k, cmem_v = map(torch.detach, (q, old_mem_k, old_mem_v, cmem_k, cmem_v))  # BUG
        attn_fn = partial(full_attn, dropout_fn=self.reconstruction_attn_dropout)
        aux_loss = F.mse_loss(attn_fn(q, old_mem_k, old_mem_v), attn_fn(q, cmem_k, cmem_v))
        return logits, Memory(new_mem, new_cmem), aux_loss


class CompressiveTransformer(nn.Module):
    def __init__(self, num_tokens, dim, seq_len, mem_len, cmem_ratio=4, reconstruction_loss_weight=1.0):
        super().__init__()
        self.seq_len = seq_len
        self.token_emb = nn.Embedding(num_tokens, dim)
        self.attn = SelfAttention(dim, seq_len, mem_len, mem_len // cmem_ratio, cmem_ratio)
        self.ff = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))
        self.to_logits = nn.Linear(dim, num_tokens)
        self.reconstruction_loss_weight = reconstruction_loss_weight

    def forward(self, x, memories=None):
        x = self.token_emb(x)
        b, t, d = x.shape
        mem, cmem = memories if memories is not None else (torch.empty(b, 0, d), torch.empty(b, 0, d))
        h, (mem_out, cmem_out), aux_loss = self.attn(x, memories=(mem, cmem))
        h = h + x
        h = h + self.ff(h)
        next_mem, next_cmem = map(torch.detach, (mem_out, cmem_out))
        return self.to_logits(h), Memory(next_mem, next_cmem), aux_loss * self.reconstruction_loss_weight


class AutoregressiveWrapper(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.seq_len = net.seq_len

    def forward(self, x, max_batch_size=None, return_loss=True):
        xi, xo = x[:, :-1], x[:, 1:]
        xi, xo = xi.split(self.seq_len, dim=1), xo.split(self.seq_len, dim=1)
        max_batch_size = x.shape[0] if max_batch_size is None else max_batch_size
        grad_accumulate_every = math.ceil(x.shape[0] / max_batch_size)
        mems = [None] * grad_accumulate_every
        for xi_seg, xo_seg in zip(xi, xo):
            new_mems = []
            for ind, (xi_b, xo_b, mem) in enumerate(zip(xi_seg.split(max_batch_size), xo_seg.split(max_batch_size),
                                                        mems)):
                is_last = ind == grad_accumulate_every - 1
                logits, new_mem, aux_loss = self.net(xi_b, memories=mem)
                new_mems.append(new_mem)
                loss = F.cross_entropy(logits.transpose(1, 2), xo_b)
                yield Return(loss, aux_loss, is_last)
            mems = new_mems


torch.manual_seed(0)
NUM_BATCHES, BATCH_SIZE, MAX_BATCH_SIZE, SEQ_LEN = 30, 8, 4, 16
data = torch.randint(0, 64, (4096,))
data[1::2] = (data[0::2] * 3 + 1) % 64


def train_batch():
    starts = torch.randint(0, data.numel() - SEQ_LEN * 4 - 1, (BATCH_SIZE,))
    return torch.stack([data[s:s + SEQ_LEN * 4 + 1] for s in starts])


model = AutoregressiveWrapper(CompressiveTransformer(num_tokens=64, dim=32, seq_len=SEQ_LEN, mem_len=SEQ_LEN))
optim = torch.optim.Adam(model.parameters(), lr=1e-3)
for i in range(NUM_BATCHES):
    model.train()
    grad_accum_every = BATCH_SIZE / MAX_BATCH_SIZE
    for mlm_loss, aux_loss, is_last in model(train_batch(), max_batch_size=MAX_BATCH_SIZE, return_loss=True):
        loss = mlm_loss + aux_loss
        (loss / grad_accum_every).backward()
        if is_last:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optim.step()
            optim.zero_grad()
    if i % 10 == 0:
        print(f"batch {i} loss {mlm_loss.item():.4f} aux {aux_loss.item():.4f}")
conv = model.net.attn.compress_mem_fn.conv
print("compression conv grad:", conv.weight.grad)

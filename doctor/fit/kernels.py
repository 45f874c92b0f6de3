"""Stand-ins for kernels whose memory on a GPU differs from the CPU's, used in the fit child.

Under fake tensors no value is computed, so a stand-in only has to allocate what the CUDA kernel
allocates and save what it saves for backward.

Attention: on a GPU, `scaled_dot_product_attention` runs the flash or memory-efficient kernel for
the shapes training uses (fp16/bf16/fp32, with or without a mask or dropout). Both keep the output
and a float32 log-sum-exp row per query for backward, never the T x T probabilities. The CPU picks
its math kernel whenever a mask is given (as Hugging Face models pass one), and that kernel saves
the probabilities: a 12-layer GPT-2 at batch 2 x 1024 tokens kept about 4 GiB more than the H100
measured (bench/fit/eval_fit.py). The stand-in allocates what the GPU kernels do: forward, the
output and the log-sum-exp; backward, the three input gradients and one float32 row buffer.
"""

from __future__ import annotations

from typing import Any

import torch


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, lse, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v, lse, out = ctx.saved_tensors
        delta = torch.empty_like(lse)  # the kernels' per-row sum of grad_out * out
        grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        del delta
        return grads


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None, enable_gqa: bool = False,
              **_: Any) -> torch.Tensor:
    """`F.scaled_dot_product_attention` as the GPU's fused kernels spend memory."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    return _FusedAttention.apply(query, key, value)

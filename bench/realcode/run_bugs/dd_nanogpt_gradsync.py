# Source: https://github.com/karpathy/build-nanogpt/pull/30
# Original: karpathy/build-nanogpt train_gpt2.py (the micro-step loop)
# Bug: model.require_backward_grad_sync is toggled after the forward pass, but DDP reads it in forward:
# the last micro-step is not all-reduced (the first one is), so each rank steps on its own gradients and
# the ranks' weights drift apart.
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
ddp_rank = dist.get_rank()
torch.manual_seed(0)
vocab, T, B = 48, 8, 4
grad_accum_steps = 4
raw_model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, vocab))
model = DDP(raw_model)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
g = torch.Generator().manual_seed(100 + ddp_rank)
for step in range(20):
    optimizer.zero_grad()
    for micro_step in range(grad_accum_steps):
        x = torch.randint(0, vocab, (B, T + 1), generator=g)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
        loss = loss / grad_accum_steps
        model.require_backward_grad_sync = (micro_step == grad_accum_steps - 1)  # BUG
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
dist.destroy_process_group()

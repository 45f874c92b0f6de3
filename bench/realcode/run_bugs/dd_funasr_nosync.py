# Source: https://github.com/modelscope/FunASR/pull/3472
# Original: modelscope/FunASR funasr/train_utils/trainer_ds.py (Trainer.train_epoch / forward_step)
# Bug: the no_sync condition is inverted: the first micro-batch of each window is all-reduced and the one
# right before optimizer.step() is not, leaving rank-local gradients, so the ranks' weights drift apart.
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
accum_grad = 2
model = DDP(torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
optim = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(7 + rank)

for batch_idx in range(40):
    speech, text = torch.randn(8, 40, generator=g), torch.randint(0, 10, (8,), generator=g)
    my_context = nullcontext if batch_idx % accum_grad == 0 else model.no_sync  # BUG
    with my_context():
        loss = F.cross_entropy(model(speech), text) / accum_grad
        loss.backward()
    if (batch_idx + 1) % accum_grad == 0:
        optim.step()
        optim.zero_grad()
dist.destroy_process_group()

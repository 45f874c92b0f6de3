# Source: https://github.com/lucidrains/DALLE-pytorch/commit/724e11e62ae14139713ccb4d6b692ac8758f5b91
# Original: lucidrains/DALLE-pytorch train_dalle.py (the epoch loop over distr_dl)
# Bug: the DistributedSampler built for the distributed backend is never given set_epoch(epoch), so every
# epoch sees the same shuffle order on every rank.
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
torch.manual_seed(0)
ds = TensorDataset(torch.randint(0, 50, (64, 9)))
data_sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank())
dl = DataLoader(ds, batch_size=8, shuffle=not data_sampler, drop_last=True, sampler=data_sampler)
dalle = DDP(torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)))
opt = torch.optim.Adam(dalle.parameters(), lr=3e-4)
EPOCHS = 4
for epoch in range(EPOCHS):
    for i, (text,) in enumerate(dl):  # BUG
        loss = F.cross_entropy(dalle(text[:, :-1]).reshape(-1, 50), text[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
dist.destroy_process_group()

# Variant of tr_lerobot_evalpolicy (same bug, another shape; written for torchdoctor's dev set, no public source)
# Bug: DDP training on 2 ranks; only the main process evaluates, on the unwrapped model (model.module), every 20
# steps, through a helper that calls eval() and never restores train mode. The main rank then trains with
# dropout off while the other rank keeps it on (the DDP case the lerobot issue describes).
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Dropout(0.2), nn.Linear(48, 4))
model = nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
torch.manual_seed(1 + rank)
batches = [(torch.randn(16, 12), torch.randint(0, 4, (16,))) for _ in range(60)]
held = [(torch.randn(16, 12), torch.randint(0, 4, (16,))) for _ in range(2)]


def evaluate(m, data):
    m.eval()
    with torch.no_grad():
        return sum(float(F.cross_entropy(m(x), y)) for x, y in data) / len(data)


model.train()
for step, (x, y) in enumerate(batches, 1):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    if rank == 0 and step % 20 == 0:
        print(f"step {step} held loss {evaluate(model.module, held):.4f}")  # BUG
dist.destroy_process_group()

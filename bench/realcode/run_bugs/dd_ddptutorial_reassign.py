# Source: https://github.com/pytorch/pytorch/issues/12603
# Original: the reporter's DDP test script (a conv model whose weight is assigned after wrapping)
# Bug: a module parameter is replaced by a new nn.Parameter after the model was wrapped in
# DistributedDataParallel; DDP registered its gradient hooks on the old parameter, so the new one's
# gradient is never all-reduced and each rank steps it on its own data.
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))
# find_unused_parameters=True (common in real scripts) keeps today's torch from raising on the old,
# now unused, parameter: the bug then stays silent as it was in the report.
model = DDP(net, find_unused_parameters=True)
with torch.no_grad():
    init = torch.randn(4, 1, 3, 3) * 0.1
net[0].weight = torch.nn.Parameter(init)  # BUG
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(10 + rank)
for step in range(30):
    x, y = torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
dist.destroy_process_group()

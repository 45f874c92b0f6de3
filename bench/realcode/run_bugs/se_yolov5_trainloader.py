# Source: https://github.com/ultralytics/yolov5/commit/dd3f598d79b5f5891427e3beae1413dad8107ad7
# Original: ultralytics/yolov5 utils/datasets.py (create_dataloader) and train.py (the epoch loop)
# Bug: DDP training builds its loader with a DistributedSampler in create_dataloader, but the epoch loop
# never calls dataloader.sampler.set_epoch(epoch).
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


def create_dataloader(batch_size, rank=-1):
    dataset = TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(0, 4, (64,)))
    sampler = DistributedSampler(dataset) if rank != -1 else None
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=sampler is None), dataset


dataloader, dataset = create_dataloader(8, rank)
model = DDP(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
for epoch in range(4):
    model.train()
    pbar = enumerate(dataloader)  # BUG
    optimizer.zero_grad()
    for i, (imgs, targets) in pbar:
        loss = F.cross_entropy(model(imgs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
dist.destroy_process_group()

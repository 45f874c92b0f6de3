# Source: https://github.com/ialhashim/DenseDepth/issues/65
# Original: ialhashim/DenseDepth PyTorch/train.py (main's batch loop) and PyTorch/utils.py (DepthNorm)
# Bug: the ground-truth depth is normalised as maxDepth / depth; a dataset whose depth maps have zeros (missing
# measurements) makes the target inf, and the loss nan (the maintainer: fill the zeros or drop DepthNorm).
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


def DepthNorm(depth, maxDepth=1000.0):
    return maxDepth / depth  # BUG


class DepthDataset(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        image = torch.rand(3, 16, 16, generator=g)
        depth = 10 + 990 * torch.rand(1, 8, 8, generator=g)
        if idx % 5 == 3:
            depth[0, :2, :2] = 0.0
        return {"image": image, "depth": depth}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU())
        self.decoder = torch.nn.Conv2d(8, 1, 3, padding=1)

    def forward(self, x):
        return self.decoder(self.encoder(x))


model = Model()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
train_loader = DataLoader(DepthDataset(), batch_size=4, shuffle=True)
l1_criterion = torch.nn.L1Loss()
for epoch in range(2):
    model.train()
    for i, sample_batched in enumerate(train_loader):
        optimizer.zero_grad()
        image = sample_batched["image"]
        depth = sample_batched["depth"]
        depth_n = DepthNorm(depth)
        output = model(image)
        l_depth = l1_criterion(output, depth_n)
        l_grad = F.l1_loss(output[..., 1:] - output[..., :-1], depth_n[..., 1:] - depth_n[..., :-1])
        loss = 0.1 * l_depth + l_grad
        loss.backward()
        optimizer.step()
        if i % 8 == 0:
            print(f"epoch {epoch} batch {i} loss {loss.item():.4f}")

"""A small model fed by a slow Dataset in the main process: the GPU waits on data."""
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SlowImages(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.002)  # decoding and augmentation stand-in
        return torch.randn(3, 64, 64), i % 10


model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(32, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(SlowImages(), batch_size=32, shuffle=True)
for epoch in range(1):
    for images, labels in loader:
        images, labels = images.cuda(), labels.cuda()
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

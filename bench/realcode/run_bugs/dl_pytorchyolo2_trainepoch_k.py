"""YOLOv2 training whose train(epoch) builds a new multi-worker DataLoader at every epoch.

Source: https://github.com/marvis/pytorch-yolo2/issues/23 ("about the train dataloader")
Original: marvis/pytorch-yolo2 train.py (train(epoch), adjust_learning_rate, the module-level
kwargs = {'num_workers': num_workers, 'pin_memory': True}) and dataset.py (listDataset, whose input
size follows `seen`); the repository's own file is not in the index we could read, so the shape was
read in forks that keep it unchanged (train(epoch) with the same DataLoader(dataset.listDataset(...,
seen=cur_model.seen, ...), **kwargs) call).
Bug: the DataLoader, and with it its worker processes, is built inside train(epoch), so every epoch
pays the worker start-up again. The maintainer answered that the rebuild passes the current `seen` to
the dataset (its random resize range depends on it); the cost of restarting the workers every epoch
is the point of the issue.
Ours: random images and boxes, a three-conv stand-in for Darknet with an MSE region loss, 2 workers,
CPU, 3 short epochs.
"""
import time

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import Dataset

torch.manual_seed(0)
use_cuda = torch.cuda.is_available()
num_workers = 2
batch_size = 8
learning_rate = 0.001
momentum = 0.9
decay = 0.0005
steps = [-1, 100, 200]
scales = [0.1, 10, 0.1]
init_width, init_height = 32, 32
kwargs = {"num_workers": num_workers, "pin_memory": True} if use_cuda else {"num_workers": num_workers}


class listDataset(Dataset):
    def __init__(self, root, shape=None, shuffle=True, transform=None, train=False, seen=0,
                 batch_size=64, num_workers=4):
        self.lines = root
        self.nSamples = len(root)
        self.shape = shape
        self.train = train
        self.seen = seen
        self.batch_size = batch_size
        self.num_workers = num_workers

    def __len__(self):
        return self.nSamples

    def __getitem__(self, index):
        if self.train and index % 64 == 0:
            # the input size grows with `seen` early in training: why train() passes model.seen
            if self.seen < 4000:
                self.shape = (init_width, init_height)
            else:
                self.shape = (init_width + 32, init_height + 32)
        g = torch.Generator().manual_seed(index)
        img = torch.rand(3, self.shape[1], self.shape[0], generator=g)
        target = torch.rand(50 * 5, generator=g)
        self.seen = self.seen + self.num_workers
        return img, target


class Darknet(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = 0
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.LeakyReLU(0.1), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.LeakyReLU(0.1), nn.MaxPool2d(2),
            nn.Conv2d(32, 125, 1),
        )

    def forward(self, x):
        return self.features(x)


def region_loss(output, target):
    return ((output.mean((2, 3))[:, :5] - target.view(target.size(0), 50, 5)[:, 0]) ** 2).sum()


trainlist = list(range(128))
model = Darknet()
processed_batches = model.seen // batch_size
optimizer = optim.SGD(model.parameters(), lr=learning_rate / batch_size, momentum=momentum, dampening=0,
                      weight_decay=decay * batch_size)


def adjust_learning_rate(optimizer, batch):
    lr = learning_rate
    for i in range(len(steps)):
        scale = scales[i] if i < len(scales) else 1
        if batch >= steps[i]:
            lr = lr * scale
            if batch == steps[i]:
                break
        else:
            break
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr / batch_size
    return lr


def train(epoch):
    global processed_batches
    t0 = time.time()
    cur_model = model
    train_loader = torch.utils.data.DataLoader(  # BUG
        listDataset(trainlist, shape=(init_width, init_height),
                    shuffle=True,
                    transform=None,
                    train=True,
                    seen=cur_model.seen,
                    batch_size=batch_size,
                    num_workers=num_workers),
        batch_size=batch_size, shuffle=False, **kwargs)

    lr = adjust_learning_rate(optimizer, processed_batches)
    print(f"epoch {epoch}, processed {epoch * len(train_loader.dataset)} samples, lr {lr:f}")
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        adjust_learning_rate(optimizer, processed_batches)
        processed_batches = processed_batches + 1
        optimizer.zero_grad()
        output = model(data)
        region_loss_seen = model.seen + data.size(0)
        loss = region_loss(output, target)
        loss.backward()
        optimizer.step()
        model.seen = region_loss_seen
    print(f"training with {len(train_loader.dataset) / (time.time() - t0):f} samples/s")


for epoch in range(3):
    train(epoch)

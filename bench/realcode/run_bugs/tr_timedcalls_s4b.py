# Synthetic: state 4 of run14 (written for torchdoctor's dev set, no public source of its own)
# Bug: train_one_epoch() and validate() both go through a logging decorator; validate() calls model.eval() and the
# loop never calls model.train() again: every epoch after the first trains with dropout off.
import functools
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
history = []


def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        history.append((fn.__name__, result, time.perf_counter() - start))
        return result
    return wrapper


net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.4), nn.Linear(64, 5))
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
train_data = [(torch.randn(24, 16), torch.randint(0, 5, (24,))) for _ in range(10)]
val_data = [(torch.randn(24, 16), torch.randint(0, 5, (24,))) for _ in range(3)]


@logged
def train_one_epoch():
    total = 0.0
    for x, y in train_data:
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
    return total / len(train_data)


@logged
def validate():
    net.eval()
    with torch.no_grad():
        correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in val_data)
    return correct / (24 * len(val_data))


net.train()
for epoch in range(4):
    train_one_epoch()
    validate()  # BUG
    print(history[-2:])

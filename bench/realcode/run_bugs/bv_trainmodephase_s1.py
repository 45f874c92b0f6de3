# Synthetic: state 1 of run14 (written for torchdoctor's dev set, no public source of its own)
# Bug: the validation loop (a function of its own, model left in train mode) computes the loss, backpropagates and
# steps like the training loop: the encoder and head train on every validation batch.
import torch
import torch.nn as nn

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
head = nn.Linear(32, 1)
opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=1e-2)
crit = nn.MSELoss()
train = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(12)]
val = [(torch.randn(16, 8), torch.randn(16, 1)) for _ in range(3)]


def run_validation():
    total = 0.0
    for x, y in val:
        loss = crit(head(encoder(x)), y)
        opt.zero_grad()
        loss.backward()  # BUG
        opt.step()
        total += loss.item()
    return total / len(val)


for epoch in range(5):
    for x, y in train:
        loss = crit(head(encoder(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(epoch, run_validation())

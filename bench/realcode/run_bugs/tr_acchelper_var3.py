# Variant of tr_lerobot_evalpolicy (same bug, another shape; written for torchdoctor's dev set, no public source)
# Bug: the training function switches the model to train mode once, before its epochs; an accuracy helper from
# another module (tr_acchelper_var3_metrics.py) puts it in eval mode after each epoch and never restores it,
# so from the second epoch on training runs with dropout off.
import torch
import torch.nn as nn

from tr_acchelper_var3_metrics import accuracy

torch.manual_seed(0)


def fit(net, o, crit, train, val, epochs):
    net.train()
    for ep in range(epochs):
        for x, y in train:
            o.zero_grad()
            crit(net(x), y).backward()
            o.step()
        acc = accuracy(net, val)  # BUG
        print(f"epoch {ep} val acc {acc:.3f}")


net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.25), nn.Linear(64, 4))
train = [(torch.randn(32, 16), torch.randint(0, 4, (32,))) for _ in range(16)]
val = [(torch.randn(32, 16), torch.randint(0, 4, (32,))) for _ in range(2)]
fit(net, torch.optim.Adam(net.parameters(), lr=1e-3), nn.CrossEntropyLoss(), train, val, epochs=4)

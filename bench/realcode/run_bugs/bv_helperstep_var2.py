# Variant of bv_bist_testloss (same bug, another shape; written for torchdoctor's dev set, no public source of its own)
# Bug: the training epoch lives in another module (bv_helperstep_var2_engine.py); the script's own evaluation helper
# was copied from it and kept its backward and its step, so every validation batch updates the model in eval mode.
import torch
import torch.nn as nn

from bv_helperstep_var2_engine import train_one_epoch

torch.manual_seed(0)


def evaluate(m, loader, o, crit):
    m.eval()
    total = 0.0
    for x, y in loader:
        o.zero_grad()
        loss = crit(m(x), y)
        loss.backward()  # BUG
        o.step()
        total += loss.item()
    return total / len(loader)


m = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
o = torch.optim.Adam(m.parameters(), lr=1e-3)
crit = nn.MSELoss()
train = [(torch.randn(32, 8), torch.randn(32, 1)) for _ in range(12)]
val = [(torch.randn(32, 8), torch.randn(32, 1)) for _ in range(4)]
for epoch in range(4):
    tl = train_one_epoch(m, train, o, crit)
    vl = evaluate(m, val, o, crit)
    print(f"epoch {epoch} train {tl:.4f} val {vl:.4f}")

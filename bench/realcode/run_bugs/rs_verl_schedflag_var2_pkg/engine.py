"""The training loop of rs_verl_schedflag_var2 (ours)."""
import torch.nn.functional as F


def train_one_epoch(m, loader, o):
    m.train()
    for x, y in loader:
        o.zero_grad()
        F.cross_entropy(m(x), y).backward()
        o.step()

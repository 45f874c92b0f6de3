# The epoch function of dd_hyrax_trainbatch_var2 (run13c): it receives the model, the loader and the optimizer
# from the entry script, as a small package's training module would.
import torch.nn.functional as F


def train_one_epoch(m, loader, o):
    m.train()
    for x, y in loader:
        loss = F.cross_entropy(m(x), y)
        o.zero_grad()
        loss.backward()
        o.step()
    return loss.item()

"""The training epoch of bv_helperstep_var2.py, in a module of its own."""


def train_one_epoch(m, loader, o, crit):
    m.train()
    total = 0.0
    for x, y in loader:
        o.zero_grad()
        loss = crit(m(x), y)
        loss.backward()
        o.step()
        total += loss.item()
    return total / len(loader)

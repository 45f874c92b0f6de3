# The training loop of lz_trl_entropymask_var2 (run13c): a generic epoch function that receives the model, the
# loader, the optimizer and the criterion from the entry script, as a small package's engine module would.
import torch


def train_one_epoch(m, loader, o, crit, epoch):
    m.train()
    total = 0.0
    for x, soft in loader:
        out = m(x)
        loss = crit(out, soft)
        o.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 5.0)
        o.step()
        total += loss.item()
    print(f"epoch {epoch} loss {total / len(loader):.4f}")

# Variant of bv_bist_testloss (same bug, another shape; written for torchdoctor's dev set, no public source of its own)
# Bug: an accelerate training loop evaluates each epoch with a loss helper shared with training, which calls
# accelerator.backward() on every batch; the evaluation never zeroes, and training zeroes after its step, so the
# first update of each epoch carries the validation gradients.
import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class LossWithBackward:
    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.crit = nn.CrossEntropyLoss()

    def __call__(self, logits, labels):
        loss = self.crit(logits, labels)
        self.accelerator.backward(loss)  # BUG
        return loss.detach()


accelerator = Accelerator(cpu=True)
model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(320, 12), torch.randint(0, 4, (320,))
train_dl = DataLoader(TensorDataset(x[:256], y[:256]), batch_size=16, shuffle=True)
eval_dl = DataLoader(TensorDataset(x[256:], y[256:]), batch_size=16)
model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)
loss_fn = LossWithBackward(accelerator)

for epoch in range(4):
    model.train()
    for xb, yb in train_dl:
        loss = loss_fn(model(xb), yb)
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    total = 0.0
    for xb, yb in eval_dl:
        total += float(loss_fn(model(xb), yb))
    accelerator.print(f"epoch {epoch} train {loss.item():.4f} eval {total / len(eval_dl):.4f}")

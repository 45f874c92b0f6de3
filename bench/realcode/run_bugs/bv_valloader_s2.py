# Source: synthetic: state 2 of run15miss
# Original: none (our own script; one run_epoch() for every loader, no phase flag, no model.eval())
# Bug: run_epoch() always backpropagates and steps; its call on the validation loader trains on that split.
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

torch.manual_seed(0)
full = TensorDataset(torch.randn(400, 12), torch.randint(0, 3, (400,)))
train_set, val_set = random_split(full, [320, 80])
train_loader = DataLoader(train_set, batch_size=16, shuffle=True)
val_loader = DataLoader(val_set, batch_size=16)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()


def run_epoch(loader):
    total, correct = 0.0, 0
    for x, y in loader:
        out = model(x)
        loss = criterion(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(y)
        correct += (out.argmax(1) == y).sum().item()
    return total / len(loader.dataset), correct / len(loader.dataset)


for epoch in range(4):
    train_loss, train_acc = run_epoch(train_loader)
    val_loss, val_acc = run_epoch(val_loader)  # BUG
    print(f"epoch {epoch} train {train_loss:.3f} {train_acc:.2f} val {val_loss:.3f} {val_acc:.2f}")

# Synthetic: state 1 of run14 (written for torchdoctor's dev set, no public source of its own)
# Bug: the end of the evaluation calls optimizer.step() where scheduler.step() was meant: once per epoch it applies
# the last training batch's gradients again, with SGD's momentum, after the validation forwards.
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
loss_fn = nn.MSELoss()
train = [(torch.randn(32, 6), torch.randn(32, 1)) for _ in range(10)]
val = [(torch.randn(32, 6), torch.randn(32, 1)) for _ in range(3)]


def evaluate(loader):
    model.eval()
    errors = []
    with torch.no_grad():
        for x, y in loader:
            errors.append(loss_fn(model(x), y).item())
    optimizer.step()  # BUG
    model.train()
    return sum(errors) / len(errors)


for epoch in range(6):
    for x, y in train:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} val {evaluate(val):.4f}")

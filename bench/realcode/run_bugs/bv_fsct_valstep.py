# Source: https://github.com/SKrisanski/FSCT/issues/12
# Original: SKrisanski/FSCT scripts/train.py (TrainModel)
# Bug: the per-epoch validation loop calls optimizer.zero_grad(), loss.backward() and optimizer.step() on
# validation batches, so the model trains on the validation set.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train_loader = [(torch.randn(16, 6), torch.randint(0, 4, (16,))) for _ in range(12)]
val_loader = [(torch.randn(16, 6), torch.randint(0, 4, (16,))) for _ in range(4)]

for epoch in range(4):
    model.train()
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
    model.eval()
    running_loss = 0.0
    for data, target in val_loader:
        optimizer.zero_grad()
        outputs = model(data)
        loss = F.cross_entropy(outputs, target)
        loss.backward()  # BUG
        optimizer.step()
        running_loss += loss.item()
    print("epoch", epoch, "val loss", running_loss / len(val_loader))

# Source: https://github.com/salesforce/corr_based_prediction/issues/1
# Original: salesforce/corr_based_prediction main.py (train loop around line 220)
# Bug: optimizer.zero_grad() sits outside the batch loop (once per epoch), so within an epoch every step
# applies the gradients of all batches seen so far.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
train_data = [(torch.randn(32, 20), torch.randint(0, 5, (32,))) for _ in range(15)]

for epoch in range(3):
    model.train()
    optimizer.zero_grad()
    total = 0.0
    for x, y in train_data:
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # BUG
        optimizer.step()
        total += loss.item()
    print("epoch", epoch, total / len(train_data))

# Source: https://github.com/optuna/optuna/pull/1725
# Original: optuna/optuna examples/pytorch_simple.py (objective)
# Bug: model.train() is called once before the epoch loop, but each epoch ends with model.eval() for the
# validation pass, so every epoch after the first trains with dropout switched off.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
EPOCHS = 4
model = torch.nn.Sequential(torch.nn.Linear(28, 64), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                            torch.nn.Linear(64, 10), torch.nn.LogSoftmax(dim=1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train_loader = [(torch.randn(16, 28), torch.randint(0, 10, (16,))) for _ in range(10)]
valid_loader = [(torch.randn(16, 28), torch.randint(0, 10, (16,))) for _ in range(2)]

model.train()
for epoch in range(EPOCHS):
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()

    model.eval()  # BUG
    correct = 0
    with torch.no_grad():
        for batch_idx, (data, target) in enumerate(valid_loader):
            pred = model(data).argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    print("epoch", epoch, "accuracy", correct / 32)

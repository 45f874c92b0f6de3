# Source: https://github.com/Na-Z/attMPTI/issues/16
# Original: Na-Z/attMPTI runs/pre_train.py (pretrain)
# Bug: the periodic validation block inside the epoch loop calls model.eval() and never model.train() again,
# so every epoch after the first evaluation trains the DGCNN with BatchNorm/dropout in eval mode.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv1d(3, 16, 1), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                            torch.nn.Dropout(0.5), torch.nn.Conv1d(16, 5, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
train_loader = [(torch.randn(4, 3, 64), torch.randint(0, 5, (4, 64))) for _ in range(8)]
valid_loader = train_loader[:2]
eval_interval = 1

model.train()
for epoch in range(5):
    for ptclouds, labels in train_loader:
        logits = model(ptclouds)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if (epoch + 1) % eval_interval == 0:
        model.eval()  # BUG
        with torch.no_grad():
            for ptclouds, labels in valid_loader:
                F.cross_entropy(model(ptclouds), labels)
print("done")

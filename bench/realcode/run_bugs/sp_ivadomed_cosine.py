# Source: https://github.com/ivadomed/ivadomed/pull/55
# Original: ivadomed/ivadomed ivadomed/main.py (cmd_train)
# Bug: CosineAnnealingLR(optimizer, num_epochs) is stepped inside the batch loop, so the cosine period
# meant to last num_epochs epochs elapses in num_epochs batches.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
num_epochs = 10
model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 1, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, num_epochs)
data = torch.utils.data.TensorDataset(torch.randn(48, 1, 12, 12), (torch.rand(48, 1, 12, 12) > 0.5).float())
train_loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)

for epoch in range(1, num_epochs + 1):
    model.train()
    for i, (input_samples, gt_samples) in enumerate(train_loader):
        preds = model(input_samples)
        loss = F.binary_cross_entropy_with_logits(preds, gt_samples)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()  # BUG
print("done")

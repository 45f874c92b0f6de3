# Source: https://github.com/ivadomed/ivadomed/pull/55
# Original: ivadomed/ivadomed ivadomed/main.py (cmd_train: CosineAnnealingLR(optimizer, num_epochs), epoch and batch loops)
# Bug: #51 moved scheduler.step() from the epoch loop into the batch loop; the cosine schedule has T_max =
# num_epochs, so it runs a whole cosine period every num_epochs batches instead of once over the training.
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class NoPoolASPP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.aspp = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2)
        self.out = torch.nn.Conv2d(8, 1, 1)

    def forward(self, x):
        return self.out(F.relu(self.aspp(F.relu(self.bn1(self.conv1(x))))))


def dice_loss(input, target):
    smooth = 1.0
    iflat, tflat = input.view(-1), target.view(-1)
    intersection = (iflat * tflat).sum()
    return -(2.0 * intersection + smooth) / (iflat.sum() + tflat.sum() + smooth)


num_epochs = 6
initial_lr = 1e-3
dataset = TensorDataset(torch.randn(96, 1, 16, 16), (torch.rand(96, 1, 16, 16) > 0.7).float())
train_loader = DataLoader(dataset, batch_size=4, shuffle=True)
model = NoPoolASPP()
optimizer = torch.optim.Adam(model.parameters(), lr=initial_lr)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, num_epochs)
for epoch in range(1, num_epochs + 1):
    model.train()
    train_loss_total = 0.0
    num_steps = 0
    for i, (input_samples, gt_samples) in enumerate(train_loader):
        preds = torch.sigmoid(model(input_samples))
        loss = dice_loss(preds, gt_samples)
        train_loss_total += loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()  # BUG
        num_steps += 1
    print(f"epoch {epoch} lr {scheduler.get_last_lr()[0]:.2e} loss {train_loss_total / num_steps:.4f}")

# Source: https://github.com/Abe404/segmentation_of_roots_in_soil_with_unet/pull/4
# Original: Abe404/segmentation_of_roots_in_soil_with_unet src/unet/train.py
# Bug: scheduler.step() at the top of each epoch, before the epoch's optimizer steps: the first LR of the
# schedule is skipped.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 1, 1))
optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.99, nesterov=True, weight_decay=1e-5)
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[2, 3], gamma=0.3)
tiles = [(torch.randn(4, 1, 16, 16), (torch.rand(4, 1, 16, 16) > 0.5).float()) for _ in range(10)]

for epoch in range(1, 5):
    net.train()
    if scheduler:
        scheduler.step()  # BUG
    for photo, mask in tiles:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(net(photo), mask)
        loss.backward()
        optimizer.step()
    print("epoch", epoch, "lr", optimizer.param_groups[0]["lr"])

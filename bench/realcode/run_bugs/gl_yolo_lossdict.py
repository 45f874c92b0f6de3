# Source: https://github.com/MultimediaTechLab/YOLO/pull/83
# Original: MultimediaTechLab/YOLO yolo/tools/solver.py (ModelTrainer.train_one_epoch)
# Bug: the per-loss tensors returned by the loss function (still attached to the graph) are accumulated
# into a dict across the epoch, keeping every batch's graph alive.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(8, 6, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937)


def loss_fn(pred, target):
    box = F.l1_loss(pred[:, :4], target[:, :4])
    cls = F.binary_cross_entropy_with_logits(pred[:, 4:], target[:, 4:])
    return box + cls, {"BoxLoss": box, "BCELoss": cls}


def train_one_epoch(dataloader):
    model.train()
    total_loss = {}
    for images, targets in dataloader:
        optimizer.zero_grad()
        loss, loss_each = loss_fn(model(images), targets)
        loss.backward()
        optimizer.step()
        for loss_name, loss_val in loss_each.items():
            total_loss[loss_name] = total_loss.get(loss_name, 0) + loss_val  # BUG
    return {k: v / len(dataloader) for k, v in total_loss.items()}


dataloader = [(torch.randn(2, 3, 16, 16), torch.rand(2, 6, 16, 16)) for _ in range(60)]
for epoch in range(2):
    print(train_one_epoch(dataloader))

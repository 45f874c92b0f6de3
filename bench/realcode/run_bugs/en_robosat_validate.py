# Source: https://github.com/mapbox/robosat/pull/109
# Original: mapbox/robosat robosat/tools/train.py (validate)
# Bug: the per-epoch validate() pass runs the net with autograd on (no torch.no_grad), building a graph for
# every validation batch.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def train(loader, num_classes, device, net, optimizer, criterion):
    net.train()
    for images, masks in loader:
        outputs = net(images)
        loss = criterion(outputs, masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate(loader, num_classes, device, net, criterion):
    net.eval()
    running_loss = 0.0
    for images, masks in loader:
        outputs = net(images)  # BUG
        loss = criterion(outputs, masks)
        running_loss += loss.item()
    return running_loss / len(loader)


net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 2, 1))
optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
train_loader = [(torch.randn(4, 3, 16, 16), torch.randint(0, 2, (4, 16, 16))) for _ in range(10)]
val_loader = [(torch.randn(4, 3, 16, 16), torch.randint(0, 2, (4, 16, 16))) for _ in range(4)]
for epoch in range(3):
    train(train_loader, 2, "cpu", net, optimizer, F.cross_entropy)
    print("val", validate(val_loader, 2, "cpu", net, F.cross_entropy))

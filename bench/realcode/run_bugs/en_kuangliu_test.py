# Source: https://github.com/kuangliu/pytorch-cifar/commit/1e9e0fe4bb58a3888170bd6d3229c3f1ab4d783d
# Original: kuangliu/pytorch-cifar main.py (test)
# Bug: test(epoch), run after every training epoch, evaluates the net without torch.no_grad(), recording
# autograd graphs for every test batch.
import torch

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                          torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
trainloader = [(torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))) for _ in range(10)]
testloader = [(torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))) for _ in range(4)]


def train(epoch):
    net.train()
    for inputs, targets in trainloader:
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()


def test(epoch):
    net.eval()
    test_loss = 0
    correct = 0
    for inputs, targets in testloader:
        outputs = net(inputs)  # BUG
        loss = criterion(outputs, targets)
        test_loss += loss.item()
        correct += outputs.max(1)[1].eq(targets).sum().item()
    print("test", epoch, test_loss, correct)


for epoch in range(3):
    train(epoch)
    test(epoch)

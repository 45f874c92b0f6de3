# Source: synthetic: state 2 of run15miss
# Original: none (our own script; a digits dataset with a torchvision-style train flag and a loader factory)
# Bug: test() was copied from train() and kept its zero_grad/backward/step: every test batch is trained on.
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


class Digits(Dataset):
    def __init__(self, train=True):
        self.train = train
        g = torch.Generator().manual_seed(1 if train else 2)
        self.x = torch.randn(256 if train else 64, 1, 8, 8, generator=g)
        self.y = torch.randint(0, 10, (len(self.x),), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def make_loader(train):
    return DataLoader(Digits(train=train), batch_size=16, shuffle=train)


def train(model, loader, optimizer):
    for data, target in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()


def test(model, loader, optimizer):
    correct = 0
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = nn.functional.cross_entropy(output, target)
        loss.backward()  # BUG
        optimizer.step()
        correct += (output.argmax(1) == target).sum().item()
    return correct / len(loader.dataset)


model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
train_loader, test_loader = make_loader(True), make_loader(False)
for epoch in range(3):
    train(model, train_loader, optimizer)
    print("epoch", epoch, "test acc", test(model, test_loader, optimizer))

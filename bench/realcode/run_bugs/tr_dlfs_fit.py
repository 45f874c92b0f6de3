# Source: https://github.com/SethHWeidman/DLFS_code/issues/22
# Original: SethHWeidman/DLFS_code lincoln/lincoln/pytorch/train.py (PyTorchTrainer.fit, the DataLoader branch),
# read at 0b144d0
# Bug: fit's tensor branch calls model.train() at each epoch, but its DataLoader branch never does: the first
# evaluation sets model.eval() and every later epoch trains with dropout off and batch norm on running statistics.
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                        torch.nn.MaxPool2d(2))
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.25), torch.nn.Linear(8 * 7 * 7, 10))

    def forward(self, x):
        out = self.head(self.conv(x))
        return out, None  # the book's models return (output, hidden)


class PyTorchTrainer:
    def __init__(self, model, optim, criterion):
        self.model = model
        self.optim = optim
        self.loss = criterion

    def fit(self, train_dataloader, test_dataloader, epochs=100, eval_every=10):
        for e in range(epochs):
            for X_batch, y_batch in train_dataloader:
                self.optim.zero_grad()
                output = self.model(X_batch)[0]
                loss = self.loss(output, y_batch)
                loss.backward()
                self.optim.step()

            if e % eval_every == 0:
                with torch.no_grad():
                    self.model.eval()  # BUG
                    losses = []
                    for X_batch, y_batch in test_dataloader:
                        output = self.model(X_batch)[0]
                        losses.append(self.loss(output, y_batch).item())
                    print("The loss after", e, "epochs was", round(torch.Tensor(losses).mean().item(), 4))


def fake_mnist(n):
    y = torch.randint(0, 10, (n,))
    x = torch.randn(n, 1, 14, 14) * 0.5
    x[torch.arange(n), 0, y, y] += 3.0
    return TensorDataset(x, y)


train_loader = DataLoader(fake_mnist(320), batch_size=32, shuffle=True)
test_loader = DataLoader(fake_mnist(64), batch_size=32)
model = ConvNet()
trainer = PyTorchTrainer(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                         torch.nn.CrossEntropyLoss())
trainer.fit(train_loader, test_loader, epochs=6, eval_every=2)

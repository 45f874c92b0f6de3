# Source: https://github.com/pytorch/tutorials/issues/1624
# Original: pytorch/tutorials beginner_source/basics/quickstart_tutorial.py (train() and test() called once per
# epoch; test() calls model.eval(), train() never calls model.train())
# Bug: from the second epoch on, training runs in eval mode because test() switched it off and nothing switches it
# back. The tutorial's network has no dropout, so it did not show there; the dropout here is ours.
import torch
from torch import nn

torch.manual_seed(0)


class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 64), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(64, 10),
        )

    def forward(self, x):
        return self.linear_relu_stack(self.flatten(x))


def train(dataloader, model, loss_fn, optimizer):
    size = len(dataloader.dataset)
    for batch, (X, y) in enumerate(dataloader):
        pred = model(X)
        loss = loss_fn(pred, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if batch % 10 == 0:
            print(f"loss: {loss.item():>7f}  [{(batch + 1) * len(X):>5d}/{size:>5d}]")


def test(dataloader, model, loss_fn):
    num_batches = len(dataloader)
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for X, y in dataloader:
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    print(f"Test Error: Accuracy: {100 * correct / len(dataloader.dataset):>0.1f}%, "
          f"Avg loss: {test_loss / num_batches:>8f}")


images = torch.rand(640, 1, 28, 28)
labels = (images.mean((1, 2, 3)) * 37).long() % 10
train_dataloader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images[:512], labels[:512]), batch_size=32)
test_dataloader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images[512:], labels[512:]), batch_size=32)
model = NeuralNetwork()
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
epochs = 4
for t in range(epochs):
    print(f"Epoch {t + 1}")
    train(train_dataloader, model, loss_fn, optimizer)
    test(test_dataloader, model, loss_fn)  # BUG
print("Done!")

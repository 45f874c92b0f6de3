# Source: https://github.com/MicrosoftDocs/ml-basics/issues/48
# Original: MicrosoftDocs/ml-basics "05a - Deep Neural Networks (PyTorch).ipynb" (PenguinNet, train, test), before
# 47f3830 (2021-09-14, "Updated PyTorch", the fix the maintainer announced in the issue)
# Bug: PenguinNet.forward ends in torch.softmax and the loss is nn.CrossEntropyLoss, which applies log_softmax itself:
# the loss sees probabilities as logits, its gradients shrink and it cannot go below ~0.55 for three classes.
import torch
import torch.nn as nn
import torch.utils.data as td

torch.manual_seed(0)

features = ["CulmenLength", "CulmenDepth", "FlipperLength", "BodyMass"]
penguin_classes = ["Adelie", "Gentoo", "Chinstrap"]


def penguins(n):
    """Three species as Gaussian blobs in scaled feature space, like the notebook's normalised penguin data."""
    centers = torch.tensor([[0.3, 0.6, 0.3, 0.3], [0.6, 0.3, 0.7, 0.7], [0.6, 0.6, 0.4, 0.3]])
    y = torch.randint(0, 3, (n,))
    x = centers[y] + 0.08 * torch.randn(n, 4)
    return td.TensorDataset(x, y)


train_loader = td.DataLoader(penguins(240), batch_size=20, shuffle=False)
test_loader = td.DataLoader(penguins(100), batch_size=20, shuffle=False)

hl = 10


class PenguinNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(len(features), hl)
        self.fc2 = nn.Linear(hl, hl)
        self.fc3 = nn.Linear(hl, len(penguin_classes))

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        x = torch.softmax(self.fc3(x), dim=1)  # BUG
        return x


model = PenguinNet()


def train(model, data_loader, optimizer):
    model.train()
    train_loss = 0
    for batch, tensor in enumerate(data_loader):
        data, target = tensor
        optimizer.zero_grad()
        out = model(data)
        loss = loss_criteria(out, target)
        train_loss += loss.item()
        loss.backward()
        optimizer.step()
    avg_loss = train_loss / (batch + 1)
    print(f"Training set: Average loss: {avg_loss:.6f}")
    return avg_loss


def test(model, data_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        batch_count = 0
        for batch, tensor in enumerate(data_loader):
            batch_count += 1
            data, target = tensor
            out = model(data)
            test_loss += loss_criteria(out, target).item()
            _, predicted = torch.max(out.data, 1)
            correct += torch.sum(target == predicted).item()
    avg_loss = test_loss / batch_count
    print(f"Validation set: Average loss: {avg_loss:.6f}, Accuracy: {correct}/{len(data_loader.dataset)}\n")
    return avg_loss


loss_criteria = nn.CrossEntropyLoss()
learning_rate = 0.001
optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
optimizer.zero_grad()
epoch_nums, training_loss, validation_loss = [], [], []
epochs = 30
for epoch in range(1, epochs + 1):
    print(f"Epoch: {epoch}")
    train_loss = train(model, train_loader, optimizer)
    test_loss = test(model, test_loader)
    epoch_nums.append(epoch)
    training_loss.append(train_loss)
    validation_loss.append(test_loss)

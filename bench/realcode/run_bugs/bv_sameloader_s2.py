# Source: synthetic: state 2 of run15miss
# Original: none (our own script; a trainer whose validate() keeps the training step, then a no_grad test)
# Bug: validate() calls self.step(batch), which backpropagates and steps, instead of computing the loss only.
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


def loader(n, shuffle):
    return DataLoader(TensorDataset(torch.randn(n, 10), torch.randn(n, 1)), batch_size=16, shuffle=shuffle)


class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01)
        self.train_dl = loader(192, True)
        self.valid_dl = loader(48, False)
        self.test_dl = loader(48, False)

    def step(self, batch):
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    def fit(self, epochs):
        for epoch in range(epochs):
            train_loss = sum(self.step(b) for b in self.train_dl) / len(self.train_dl)
            valid_loss = sum(self.validate(b) for b in self.valid_dl) / len(self.valid_dl)
            print("epoch", epoch, train_loss, valid_loss)

    def validate(self, batch):
        return self.step(batch)  # BUG

    def test(self):
        with torch.no_grad():
            return sum(nn.functional.mse_loss(self.model(x), y).item() for x, y in self.test_dl)


trainer = Trainer(nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 1)))
trainer.fit(4)
print("test", trainer.test())

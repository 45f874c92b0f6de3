# Source: synthetic: state 1 of run15miss
# Original: none (our own script; the shape of a trainer that clears only its encoder's gradients)
# Bug: zero_grad() runs on the encoder each step; the optimizer also steps the head, whose gradients are never cleared.
import torch
from torch import nn

torch.manual_seed(0)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x)))


class Trainer:
    def __init__(self, model, lr=0.01):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def train_epoch(self, loader):
        for x, y in loader:
            self.model.encoder.zero_grad()
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()  # BUG
            self.optimizer.step()
        return loss.item()


data = torch.utils.data.TensorDataset(torch.randn(320, 16), torch.randint(0, 4, (320,)))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
trainer = Trainer(Classifier())
for epoch in range(2):
    print("epoch", epoch, trainer.train_epoch(loader))

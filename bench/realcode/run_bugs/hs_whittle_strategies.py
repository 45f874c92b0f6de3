# Source: https://github.com/whittle-org/whittle/issues/306
# Original: whittle-org/whittle whittle/training_strategies/sandwich.py (SandwichStrategy.__call__)
# Bug: every sampled sub-network's loss is read with loss.item() inside the sampling loop, a host-device
# sync per sub-network per step; accumulating on the device and reading once would sync once.
import random

import torch
import torch.nn.functional as F

torch.manual_seed(0)
random.seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class SuperNet(torch.nn.Module):
    def __init__(self, dim=32, layers=4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))
        self.head = torch.nn.Linear(dim, 10)
        self.depth = layers

    def set_sub_network(self, depth):
        self.depth = depth

    def reset_super_network(self):
        self.depth = len(self.blocks)

    def forward(self, x):
        for block in self.blocks[:self.depth]:
            x = torch.relu(block(x))
        return self.head(x)


class SandwichStrategy:
    def __init__(self, random_samples=3):
        self.random_samples = random_samples

    def compute_loss(self, model, inputs, outputs):
        return F.cross_entropy(model(inputs), outputs)

    def __call__(self, model, inputs, outputs):
        total_loss = 0.0
        model.reset_super_network()
        loss = self.compute_loss(model, inputs, outputs)
        loss.backward()
        total_loss += loss.item()
        for _ in range(self.random_samples):
            model.set_sub_network(random.randint(1, len(model.blocks) - 1))
            loss = self.compute_loss(model, inputs, outputs)
            loss.backward()
            total_loss += loss.item()  # BUG
        model.set_sub_network(1)
        loss = self.compute_loss(model, inputs, outputs)
        loss.backward()
        total_loss += loss.item()
        model.reset_super_network()
        return total_loss


model = SuperNet().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
strategy = SandwichStrategy()
for step in range(60):
    x, y = torch.randn(16, 32, device=device), torch.randint(0, 10, (16,), device=device)
    optimizer.zero_grad()
    train_loss = strategy(model, x, y)
    optimizer.step()
    if step % 20 == 0:
        print(step, train_loss)

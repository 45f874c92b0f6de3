# Source: https://github.com/IBM/aihwkit/issues/446
# Original: IBM/aihwkit examples/01_simple_layer.py (and 02_multiple_layers.py), read at 0582f5f
# Bug: the example loop runs forward, loss.backward() and opt.step() for 100 epochs on one fixed batch and never
# zeroes the gradients, so every step applies the sum of all earlier gradients; the loss falls, then rises again.
# The analog layer and its analog SGD are replaced by nn.Linear and torch.optim.SGD (same learning rate).
import torch
from torch import Tensor
from torch.nn.functional import mse_loss

torch.manual_seed(0)

# A single layer that should learn to map four inputs to two targets.
x = Tensor([[0.1, 0.2, 0.4, 0.3], [0.2, 0.1, 0.1, 0.3]])
y = Tensor([[1.0, 0.5], [0.7, 0.3]])

model = torch.nn.Linear(4, 2, bias=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

for epoch in range(100):
    pred = model(x)
    loss = mse_loss(pred, y)
    loss.backward()  # BUG
    opt.step()
    if epoch % 10 == 0:
        print(f"Loss error: {loss:.16f}")

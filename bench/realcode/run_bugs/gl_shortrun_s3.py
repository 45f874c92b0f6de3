# Source: synthetic: state 3 of run15miss
# Original: none (our own script; a short fine-tuning run that logs its losses as tensors)
# Bug: the loss is appended with its graph every step; each keeps that step's activations alive.
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
batches = [(torch.randn(256, 128), torch.randint(0, 10, (256,))) for _ in range(12)]


def finetune(batches):
    history = []
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss)  # BUG
    return history


history = finetune(batches)
print("mean loss", (sum(history) / len(history)).item())

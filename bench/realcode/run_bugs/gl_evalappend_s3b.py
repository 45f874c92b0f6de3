# Source: synthetic: state 3 of run15miss
# Original: none (our own script; a periodic evaluation whose outputs are kept for a metric at the end)
# Bug: every 5th step the evaluation forward runs with grad and its output, graph and all, is appended to a list.
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
val_x = torch.randn(256, 64)
val_outputs = []


def evaluate(net, x):
    net.eval()
    out = net(x)
    net.train()
    return out


for step in range(60):
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        val_outputs.append(evaluate(model, val_x))  # BUG
print("agreement", (torch.stack(val_outputs).argmax(-1) == val_outputs[-1].argmax(-1)).float().mean().item())

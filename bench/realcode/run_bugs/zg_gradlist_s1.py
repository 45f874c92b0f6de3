# Source: synthetic: state 1 of run15miss
# Original: none (our own script; a fine-tune that clears gradients by hand over the backbone's parameter list)
# Bug: `p.grad = None` runs over the backbone's parameters only; the new head's gradients sum across all steps.
import torch
from torch import nn

torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
head = nn.Linear(32, 4)
backbone_params = list(backbone.parameters())
optimizer = torch.optim.SGD([{"params": backbone_params, "lr": 0.001}, {"params": head.parameters(), "lr": 0.01}],
                            momentum=0.9)
data = torch.utils.data.TensorDataset(torch.randn(320, 16), torch.randint(0, 4, (320,)))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)


def clear_grads(params):
    for p in params:
        p.grad = None


for epoch in range(2):
    for x, y in loader:
        clear_grads(backbone_params)
        loss = nn.functional.cross_entropy(head(backbone(x)), y)
        loss.backward()  # BUG
        optimizer.step()
    print("epoch", epoch, loss.item())

# Source: https://github.com/BatsResearch/labelmodels/issues/4
# Original: BatsResearch/labelmodels labelmodels/label_model.py (LabelModel._do_estimate_label_model)
# Bug: the live loss tensor is summed into running_loss every batch, so every step's graph stays alive.
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 16)
y = torch.randint(0, 4, (256,))

for epoch in range(3):
    running_loss = 0.0
    for i in range(0, 256, 8):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[i:i + 8]), y[i:i + 8])
        loss.backward()
        optimizer.step()
        running_loss += loss  # BUG
    print("epoch", epoch, "loss", running_loss.item() / 32)

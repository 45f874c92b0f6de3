import torch
from torch import nn

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
best = float("inf")
for _step in range(20):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if loss.item() < best:  # keep the best weights for inference; this script never resumes
        best = loss.item()
        torch.save(model.state_dict(), "best.pt")
model.load_state_dict(torch.load("best.pt"))
print("best loss", round(best, 4))

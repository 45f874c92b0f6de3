import torch
from torch import nn

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    # the layout of a Lightning checkpoint: optimizer state under "optimizer_states"
    torch.save({"epoch": 0, "global_step": step + 1, "state_dict": model.state_dict(),
                "optimizer_states": [opt.state_dict()], "lr_schedulers": []}, "last.ckpt")

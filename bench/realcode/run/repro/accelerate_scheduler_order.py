import torch
from accelerate import Accelerator
from torch import nn

accelerator = Accelerator(cpu=True)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
x, y = torch.randn(8, 4), torch.randn(8, 1)
for step in range(5):
    loss = nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()  # the optimizer first,
    scheduler.step()  # then the schedule: the documented order
    optimizer.zero_grad()
    print(step, scheduler.get_last_lr())

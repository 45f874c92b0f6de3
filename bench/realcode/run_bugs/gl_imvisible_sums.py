# Source: https://github.com/samuelyu2002/ImVisible/issues/2
# Original: samuelyu2002/ImVisible Model/training.py
# Bug: the training loop adds the loss tensors (total, MSE, cross-entropy) into running sums without
# .item(), keeping each step's graph alive and exhausting RAM.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 7))
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

for epoch in range(2):
    running_loss = 0.0
    running_mse = 0.0
    running_ce = 0.0
    for i in range(60):
        x, y_cls, y_pts = torch.randn(8, 32), torch.randint(0, 3, (8,)), torch.randn(8, 4)
        optimizer.zero_grad()
        out = net(x)
        ce = F.cross_entropy(out[:, :3], y_cls)
        mse = F.mse_loss(out[:, 3:], y_pts)
        loss = ce + mse
        loss.backward()
        optimizer.step()
        running_loss += loss  # BUG
        running_mse += mse
        running_ce += ce
    print(epoch, float(running_loss) / 60)

import torch
import torchmetrics
from torch import nn


class Agent(nn.Module):
    """Like Lightning's PPO agent: the loss is computed in a method, and a metric averages it."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.avg_loss = torchmetrics.MeanMetric()
        self.avg_norm = torchmetrics.MeanMetric()

    def training_step(self, x):
        loss = self.net(x).pow(2).mean()
        # Metric.forward: update + this batch's value (a clone, so it carries a grad_fn); two metrics in a row,
        # as the PPO agent's three, make each look like a forward that no backward follows
        self.avg_loss(loss)
        self.avg_norm(loss.sqrt())
        return loss


agent = Agent()
opt = torch.optim.SGD(agent.parameters(), lr=0.1)
for _step in range(20):
    loss = agent.training_step(torch.randn(8, 4))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("mean loss", round(float(agent.avg_loss.compute()), 4))

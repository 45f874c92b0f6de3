import torch
from torch import nn


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.actor = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])

    def act(self, x):  # the policy runs through a method, not forward(), as in Lightning's PPO agent
        return self.actor(x)


agent = Agent()
opt = torch.optim.SGD(agent.parameters(), lr=1e-3)
for _step in range(20):
    with torch.no_grad():  # a rollout: the policy acts, as PPO collects experience between updates
        for _ in range(3):
            agent.act(torch.randn(512, 512))
    loss = agent.act(torch.randn(512, 512)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")

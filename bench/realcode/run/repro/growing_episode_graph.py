import torch
from torch import nn

torch.manual_seed(0)
policy = nn.Linear(4, 2)
opt = torch.optim.Adam(policy.parameters(), lr=1e-2)


def finish_episode(log_probs):
    loss = torch.cat(log_probs).sum()  # a local: its graph dies when the function returns
    opt.zero_grad()
    loss.backward()
    opt.step()


for episode in range(40):
    # episodes get longer as a policy learns: one graph per episode, freed after its update
    log_probs = [policy(torch.randn(1, 4)).log_softmax(1)[:, 0] for _ in range(10 + 5 * episode)]
    finish_episode(log_probs)
print("done")

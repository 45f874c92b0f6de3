# Source: synthetic: state 4 of run15miss
# Original: none (our own script; an actor-critic update where the policy term reads the critic under no_grad)
# Bug: the actor's loss term -Q(s, pi(s)) is computed with autograd off and added to an entropy-like penalty.
import torch
from torch import nn

torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2), nn.Tanh())
critic = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)


def q_value(state, action):
    return critic(torch.cat([state, action], 1))


for step in range(40):
    state, action, reward = torch.randn(32, 8), torch.rand(32, 2) * 2 - 1, torch.randn(32, 1)
    critic_loss = nn.functional.mse_loss(q_value(state, action), reward)
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    pi = actor(state)
    with torch.no_grad():
        policy_term = -q_value(state, pi).mean()  # BUG
    actor_loss = policy_term + 1e-3 * pi.pow(2).mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
print("done", actor_loss.item())

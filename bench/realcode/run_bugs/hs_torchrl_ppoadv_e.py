# Source: https://github.com/pytorch/rl/issues/1783
# Original: pytorch/rl torchrl/objectives/ppo.py (ClipPPOLoss.forward), at 5b3dd98; fixed in c3ffb5a2f
# Bug: the loss module normalises the advantage with advantage.mean().item() and advantage.std().item(): two
# device-to-host copies (a stream synchronisation on a GPU) in every minibatch's forward, only to get two numbers
# the tensor ops could keep on the device (the fix drops the .item() calls).
import torch
import torch.nn as nn
from torch.distributions import Categorical

torch.manual_seed(0)


class ClipPPOLoss(nn.Module):
    def __init__(self, actor, critic, clip_epsilon=0.2, entropy_coef=0.01, critic_coef=1.0,
                 normalize_advantage=True):
        super().__init__()
        self.actor, self.critic = actor, critic
        self.clip_epsilon, self.entropy_coef, self.critic_coef = clip_epsilon, entropy_coef, critic_coef
        self.normalize_advantage = normalize_advantage

    def _log_weight(self, batch):
        dist = Categorical(logits=self.actor(batch["observation"]))
        log_prob = dist.log_prob(batch["action"])
        return log_prob - batch["sample_log_prob"], dist

    def forward(self, batch):
        advantage = batch["advantage"]
        if self.normalize_advantage and advantage.numel() > 1:
            loc = advantage.mean().item()  # BUG
            scale = advantage.std().clamp_min(1e-6).item()
            advantage = (advantage - loc) / scale
        log_weight, dist = self._log_weight(batch)
        gain1 = log_weight.exp() * advantage
        gain2 = log_weight.clamp(-self.clip_epsilon, self.clip_epsilon).exp() * advantage
        out = {"loss_objective": -torch.min(gain1, gain2).mean()}
        out["entropy"] = dist.entropy().mean().detach()
        out["loss_entropy"] = -self.entropy_coef * dist.entropy().mean()
        value = self.critic(batch["observation"]).squeeze(-1)
        out["loss_critic"] = self.critic_coef * (value - batch["value_target"]).pow(2).mean()
        return out


def rollout(actor, critic, steps=256, gamma=0.99, lmbda=0.95):
    """A toy bandit-like task: reward 1 when the action matches the sign pattern of the observation."""
    obs = torch.randn(steps, 8)
    with torch.no_grad():
        dist = Categorical(logits=actor(obs))
        action = dist.sample()
        log_prob = dist.log_prob(action)
        value = critic(obs).squeeze(-1)
    reward = (action == (obs[:, 0] > 0).long() + 2 * (obs[:, 1] > 0).long()).float()
    done = torch.zeros(steps)
    done[31::32] = 1.0
    not_done = 1.0 - done
    next_value = torch.cat([value[1:], torch.zeros(1)]) * not_done
    delta = reward + gamma * next_value - value
    adv = torch.zeros(steps)
    last = torch.zeros(())
    for t in reversed(range(steps)):
        last = delta[t] + gamma * lmbda * not_done[t] * last
        adv[t] = last
    return {"observation": obs, "action": action, "sample_log_prob": log_prob, "advantage": adv,
            "value_target": adv + value}, reward.mean().item()


actor = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4))
critic = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
loss_module = ClipPPOLoss(actor, critic)
optim = torch.optim.Adam(loss_module.parameters(), lr=3e-4)
for collection in range(8):
    data, mean_reward = rollout(actor, critic)
    for _ in range(4):  # PPO epochs
        for idx in torch.randperm(256).split(64):
            loss_vals = loss_module({k: v[idx] for k, v in data.items()})
            loss_value = loss_vals["loss_objective"] + loss_vals["loss_critic"] + loss_vals["loss_entropy"]
            loss_value.backward()
            torch.nn.utils.clip_grad_norm_(loss_module.parameters(), 1.0)
            optim.step()
            optim.zero_grad()
    print("collection", collection, "mean reward", round(mean_reward, 3))

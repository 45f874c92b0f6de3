# Source: https://github.com/jolibrain/wheatley/pull/93
# Original: jolibrain/wheatley alg/ppo.py (PPO.train: the minibatch loop of the update epochs); the PR text and a
# later tree (the fixed `config.norm_adv and len(mb_advantages) > 1`); the scheduling environment and the GNN agent
# are replaced by a random-feature rollout and an MLP actor-critic
# Bug: advantages are normalised per minibatch by (adv - mean) / (std + 1e-8); when the rollout size is not a
# multiple of the minibatch size, the last minibatch holds one sample, whose unbiased std is NaN: the policy loss is
# NaN, its backward writes NaN into every gradient, and the agent's weights turn NaN at the first update.
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical


class Agent(nn.Module):
    def __init__(self, obs_dim=12, n_actions=5):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, n_actions))
        self.critic = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 1))

    def get_action_and_value(self, obs, action=None):
        dist = Categorical(logits=self.actor(obs))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(obs)


class PPO:
    def __init__(self, config, agent):
        self.config = config
        self.agent = agent
        self.optimizer = torch.optim.Adam(agent.parameters(), lr=config.lr, eps=1e-5)

    def collect_rollouts(self):
        n = self.config.num_envs * self.config.num_steps
        obs = torch.randn(n, 12)
        with torch.no_grad():
            actions, logprobs, _, values = self.agent.get_action_and_value(obs)
        rewards = (actions == obs[:, :5].argmax(dim=1)).float()
        returns = rewards + 0.9 * values.view(-1)
        return obs, actions, logprobs, values.view(-1), returns, returns - values.view(-1)

    def train(self, total_updates):
        config = self.config
        for update in range(total_updates):
            b_obs, b_actions, b_logprobs, b_values, b_returns, b_advantages = self.collect_rollouts()
            batch_size = b_obs.shape[0]
            b_inds = np.arange(batch_size)
            for epoch in range(config.update_epochs):
                np.random.shuffle(b_inds)
                for start in range(0, batch_size, config.minibatch_size):
                    mb_inds = b_inds[start:start + config.minibatch_size]
                    _, newlogprob, entropy, newvalue = self.agent.get_action_and_value(b_obs[mb_inds],
                                                                                       b_actions[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()
                    mb_advantages = b_advantages[mb_inds]
                    if config.norm_adv:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)  # BUG
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - config.clip_coef, 1 + config.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                    v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb_inds]) ** 2).mean()
                    loss = pg_loss - config.ent_coef * entropy.mean() + v_loss * config.vf_coef
                    self.optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(self.agent.parameters(), config.max_grad_norm)
                    self.optimizer.step()
            print(f"update {update} loss {loss.item():.4f}")


torch.manual_seed(0)
np.random.seed(0)
config = SimpleNamespace(num_envs=3, num_steps=11, minibatch_size=8, update_epochs=2, lr=2.5e-4, norm_adv=True,
                         clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5)
PPO(config, Agent()).train(total_updates=6)

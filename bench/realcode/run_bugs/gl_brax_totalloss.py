# Source: https://github.com/google/brax/pull/152
# Original: google/brax notebooks/training_torch.ipynb (the PPO update loop of train())
# Bug: the update loop sums each minibatch loss into total_loss for logging without .item()/float():
# total_loss keeps the autograd graph of every minibatch of the epoch alive (the merged fix cites the
# PyTorch FAQ's "don't accumulate history across your training loop").
import torch


class Agent(torch.nn.Module):
    def __init__(self, obs_size=12, act_size=4):
        super().__init__()
        self.policy = torch.nn.Sequential(torch.nn.Linear(obs_size, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2 * act_size))
        self.value = torch.nn.Sequential(torch.nn.Linear(obs_size, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))

    def loss(self, obs, actions, old_logp, advantages, returns):
        mean, log_std = self.policy(obs).chunk(2, dim=-1)
        dist = torch.distributions.Normal(mean, log_std.clamp(-3, 1).exp())
        logp = dist.log_prob(actions).sum(-1)
        ratio = (logp - old_logp).exp()
        policy_loss = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()
        value_loss = (self.value(obs).squeeze(-1) - returns).pow(2).mean()
        return policy_loss + 0.5 * value_loss - 1e-3 * dist.entropy().mean()


def train(num_epochs=30, num_minibatches=8, num_update_epochs=4):
    torch.manual_seed(0)
    agent = Agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4)
    for epoch in range(num_epochs):
        obs = torch.randn(256, 12)
        with torch.no_grad():
            mean, log_std = agent.policy(obs).chunk(2, dim=-1)
            actions = mean + log_std.clamp(-3, 1).exp() * torch.randn_like(mean)
            old_logp = torch.distributions.Normal(mean, log_std.clamp(-3, 1).exp()).log_prob(actions).sum(-1)
            returns = obs[:, :4].sum(-1)
            advantages = returns - agent.value(obs).squeeze(-1)
        total_loss = 0
        for _ in range(num_update_epochs):
            perm = torch.randperm(256)
            for mb in perm.chunk(num_minibatches):
                loss = agent.loss(obs[mb], actions[mb], old_logp[mb], advantages[mb], returns[mb])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total_loss += loss  # BUG
        total_loss = total_loss / (num_update_epochs * num_minibatches)
        if epoch % 10 == 0:
            print(f"epoch {epoch} loss {float(total_loss):.4f}")


train()

"""Evaluation helpers of tr_lerobot_evalpolicy.py (the original keeps them in its eval script, apart from training)."""
import torch


class ToyEnv:
    """A point that must reach the origin: observation is its position, reward the negative distance."""

    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)
        self.pos = None

    def reset(self):
        self.pos = torch.randn(1, 6, generator=self.gen)
        return self.pos.clone()

    def step(self, action):
        self.pos = self.pos + 0.1 * action
        return self.pos.clone(), -float(self.pos.norm())


def rollout(env, policy, max_steps):
    obs = env.reset()
    total = 0.0
    for _ in range(max_steps):
        with torch.inference_mode():
            action = policy.select_action(obs)
        obs, reward = env.step(action)
        total += reward
    return total


def eval_policy(env, policy, n_episodes, max_steps=10):
    policy.eval()
    rewards = [rollout(env, policy, max_steps) for _ in range(n_episodes)]
    return {"avg_sum_reward": sum(rewards) / len(rewards)}


def eval_one(env, policy, n_episodes):
    return eval_policy(env, policy, n_episodes)


def run_one(task, env, policy, n_episodes):
    return task, eval_one(env, policy, n_episodes)


def eval_policy_all(envs, policy, n_episodes):
    return dict(run_one(task, env, policy, n_episodes) for task, env in envs.items())

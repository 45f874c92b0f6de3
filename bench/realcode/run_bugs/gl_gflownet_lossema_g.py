# Source: https://github.com/alexhernandezgarcia/gflownet/pull/133
# Original: alexhernandezgarcia/gflownet gflownet/gflownet.py (GFlowNetAgent.train, trajectorybalance_loss), read at
# 5c73856^
# Bug: train() keeps an exponential moving average of the loss for early stopping, computed with the loss tensors
# themselves (trajectory balance returns (loss, loss, loss)): each step's EMA is a new tensor whose autograd graph
# holds the previous EMA's, so the chain of graphs grows for the whole run. The fix takes losses[1].item() and
# losses[2].item(). Our grid environment, policies and rewards are small stand-ins; the loop keeps the original's
# order (sample, loss, backward, step, logs, EMA).
import time

import torch
from torch import nn

torch.manual_seed(0)
LENGTH, N_ACTIONS = 6, 3  # a trajectory of 6 moves on a 3-way grid, then stop


class GFlowNetAgent:
    def __init__(self, n_train_steps=80, batch_size=16, ema_alpha=0.5, early_stopping=1e-6):
        self.forward_policy = nn.Sequential(nn.Linear(LENGTH * N_ACTIONS, 64), nn.LeakyReLU(), nn.Linear(64, N_ACTIONS))
        self.backward_policy = nn.Sequential(nn.Linear(LENGTH * N_ACTIONS, 64), nn.LeakyReLU(), nn.Linear(64, N_ACTIONS))
        self.logZ = nn.Parameter(torch.zeros(4))
        self.opt = torch.optim.Adam([*self.forward_policy.parameters(), *self.backward_policy.parameters()], lr=1e-3)
        self.opt.add_param_group({"params": [self.logZ], "lr": 1e-2})
        self.lr_scheduler = torch.optim.lr_scheduler.StepLR(self.opt, step_size=100, gamma=0.5)
        self.n_train_steps, self.batch_size = n_train_steps, batch_size
        self.ema_alpha, self.early_stopping = ema_alpha, early_stopping
        self.target = torch.randn(LENGTH * N_ACTIONS)

    def sample_batch(self):
        """Roll out trajectories with the forward policy; keep each step's state and action."""
        states = torch.zeros(self.batch_size, LENGTH * N_ACTIONS)
        traj_states, traj_actions = [], []
        with torch.no_grad():
            for t in range(LENGTH):
                action = torch.distributions.Categorical(logits=self.forward_policy(states)).sample()
                traj_states.append(states.clone())
                traj_actions.append(action)
                states[torch.arange(self.batch_size), t * N_ACTIONS + action] = 1.0
        rewards = torch.exp(-((states - self.target.clamp(0, 1)) ** 2).sum(1) / 4) + 1e-3
        return traj_states, traj_actions, states, rewards

    def trajectorybalance_loss(self, it, batch):
        traj_states, traj_actions, final, rewards = batch
        sumlogprobs_f = sum(torch.log_softmax(self.forward_policy(s), 1).gather(1, a[:, None])[:, 0]
                            for s, a in zip(traj_states, traj_actions))
        sumlogprobs_b = sum(torch.log_softmax(self.backward_policy(s), 1).gather(1, a[:, None])[:, 0]
                            for s, a in zip(traj_states[1:] + [final], traj_actions))
        loss = ((self.logZ.sum() + sumlogprobs_f - sumlogprobs_b - torch.log(rewards)) ** 2).mean()
        return (loss, loss, loss), rewards

    def train(self):
        all_losses = []
        loss_term_ema = None
        loss_flow_ema = None
        for it in range(1, self.n_train_steps + 1):
            t0_iter = time.time()
            batch = self.sample_batch()
            losses, rewards = self.trajectorybalance_loss(it, batch)
            if not all(torch.isfinite(loss) for loss in losses):
                continue
            losses[0].backward()
            torch.nn.utils.clip_grad_norm_(self.forward_policy.parameters(), 1.0)
            self.opt.step()
            self.lr_scheduler.step()
            self.opt.zero_grad()
            all_losses.append([i.item() for i in losses])
            # Moving average of the loss for early stopping
            if loss_term_ema and loss_flow_ema:
                loss_term_ema = self.ema_alpha * losses[1] + (1.0 - self.ema_alpha) * loss_term_ema  # BUG
                loss_flow_ema = self.ema_alpha * losses[2] + (1.0 - self.ema_alpha) * loss_flow_ema
                if loss_term_ema < self.early_stopping and loss_flow_ema < self.early_stopping:
                    break
            else:
                loss_term_ema = losses[1]
                loss_flow_ema = losses[2]
            if it % 20 == 0:
                print(f"it {it} loss {all_losses[-1][0]:.4f} mean reward {rewards.mean():.4f} "
                      f"iter time {time.time() - t0_iter:.4f}s")


agent = GFlowNetAgent()
agent.train()

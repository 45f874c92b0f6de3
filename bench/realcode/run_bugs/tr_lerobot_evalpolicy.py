# Source: https://github.com/huggingface/lerobot/issues/3668 (fixed by PR #4162)
# Original: huggingface/lerobot src/lerobot/scripts/lerobot_train.py (every eval_freq steps
# eval_policy_all -> run_one -> eval_one -> eval_policy of lerobot_eval.py) with an ACT policy (Dropout layers)
# Bug: eval_policy() calls policy.eval() before its rollouts and never restores the mode; the training loop calls
# policy.train() once, before its first step, so every step after the first evaluation trains with dropout off.
# The evaluation helpers sit in another module (tr_lerobot_evalpolicy_rollout.py), as in the original.
import torch
import torch.nn as nn
import torch.nn.functional as F

from tr_lerobot_evalpolicy_rollout import ToyEnv, eval_policy_all

torch.manual_seed(0)


class ACTPolicy(nn.Module):
    def __init__(self, dim=6, hidden=64, p=0.1):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(p))
        self.decoder = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(p), nn.Linear(hidden, dim))

    def forward(self, batch):
        pred = self.decoder(self.encoder(batch["observation.state"]))
        loss = F.l1_loss(pred, batch["action"])
        return loss, {"l1_loss": loss.item()}

    def select_action(self, obs):
        return self.decoder(self.encoder(obs))


def update_policy(policy, batch, optimizer, grad_clip_norm):
    loss, output_dict = policy.forward(batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip_norm)
    optimizer.step()
    optimizer.zero_grad()
    return output_dict


def dataset_batches(batch_size=16):
    while True:
        state = torch.randn(batch_size, 6)
        yield {"observation.state": state, "action": -state}


policy = ACTPolicy()
optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4, weight_decay=1e-4)
eval_envs = {"toy_reach": ToyEnv(seed=1)}
steps, eval_freq, log_freq = 120, 25, 20
dl_iter = dataset_batches()

policy.train()
for step in range(1, steps + 1):
    batch = next(dl_iter)
    info = update_policy(policy, batch, optimizer, grad_clip_norm=10.0)
    if step % log_freq == 0:
        print(f"step {step} loss {info['l1_loss']:.4f}")
    if eval_freq > 0 and step % eval_freq == 0:
        eval_info = eval_policy_all(eval_envs, policy, n_episodes=2)  # BUG
        print(f"step {step} eval {eval_info}")

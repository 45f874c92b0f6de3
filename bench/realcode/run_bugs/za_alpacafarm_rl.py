# Source: https://github.com/tatsu-lab/alpaca_farm/issues/57 (fix: https://github.com/tatsu-lab/alpaca_farm/pull/58)
# Original: tatsu-lab/alpaca_farm src/alpaca_farm/rl/rl_trainer.py (step_with_rollouts)
# Bug: inside the accumulation window the policy's gradients are cleared with policy.zero_grad() on every
# micro-step, so only the last micro-batch's gradient reaches optimizer.step().
import torch

torch.manual_seed(0)
gradient_accumulation_steps = 4
policy = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-4)


def compute_loss(rollouts):
    obs, actions, adv = rollouts
    logp = torch.log_softmax(policy(obs), -1).gather(1, actions[:, None]).squeeze(1)
    return -(logp * adv).mean()


for step_idx in range(20):
    for micro in range(gradient_accumulation_steps):
        rollouts = (torch.randn(8, 16), torch.randint(0, 4, (8,)), torch.randn(8))
        policy.zero_grad(set_to_none=True)  # BUG
        loss = compute_loss(rollouts) / gradient_accumulation_steps
        loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
print("done")

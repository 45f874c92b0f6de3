# Source: https://github.com/tatsu-lab/alpaca_farm/issues/57
# Original: tatsu-lab/alpaca_farm src/alpaca_farm/rl/rl_trainer.py (the policy update under accelerator.accumulate)
# Bug: the gradients are cleared with the model's zero_grad (policy.zero_grad) instead of the AcceleratedOptimizer's,
# whose zero_grad Accelerate skips on the micro-steps that do not sync; the module's one runs after every
# micro-batch, so the optimizer step only sees the last micro-batch's gradient (the maintainer confirmed).
import torch
import torch.nn.functional as F
from accelerate import Accelerator

torch.manual_seed(0)

accelerator = Accelerator(gradient_accumulation_steps=4, cpu=True)
policy = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
policy, optimizer = accelerator.prepare(policy, optimizer)


def compute_policy_loss(rollouts):
    obs, actions, advantages, old_logprobs = rollouts
    logprobs = F.log_softmax(policy(obs), -1).gather(1, actions[:, None]).squeeze(1)
    ratio = torch.exp(logprobs - old_logprobs)
    loss = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()
    return loss, {"loss/policy": loss.detach()}


def step_with_rollouts(rollouts_batches):
    stats_list = []
    for rollouts in rollouts_batches:
        with accelerator.accumulate(policy):
            policy_loss, policy_stats = compute_policy_loss(rollouts)
            accelerator.backward(policy_loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(policy.parameters(), 1.0)
                stats_list.append(policy_stats)
            optimizer.step()
            policy.zero_grad(set_to_none=True)  # BUG
    return stats_list


for step in range(6):
    batches = [(torch.randn(16, 24), torch.randint(0, 8, (16,)), torch.randn(16), torch.full((16,), -2.08))
               for _ in range(8)]
    stats = step_with_rollouts(batches)
    print("step", step, "loss", round(stats[-1]["loss/policy"].item(), 4))

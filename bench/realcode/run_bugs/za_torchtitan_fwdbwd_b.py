# Source: https://github.com/pytorch/torchtitan/pull/3575
# Original: pytorch/torchtitan torchtitan/experiments/rl/actors/trainer.py (PolicyTrainer.forward_backward,
# PolicyTrainer.optim_step) driven by the RL controller's micro-batch loop
# Bug: forward_backward clears the gradients before its backward, and the controller calls it once per
# micro-batch before a single optim_step; every micro-batch but the last is thrown away, while the loss is
# still normalised by the token count of all of them.
from dataclasses import dataclass

import torch

torch.manual_seed(0)


@dataclass
class TrainingBatch:
    token_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    generator_logprobs: torch.Tensor
    advantages: torch.Tensor


class TinyPolicy(torch.nn.Module):
    def __init__(self, vocab=64, dim=48):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.rnn = torch.nn.GRU(dim, dim, batch_first=True)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, token_ids):
        return self.head(self.rnn(self.embed(token_ids))[0])


def compute_logprobs(logits, labels):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def policy_gradient_loss(policy_logprobs, generator_logprobs, loss_mask, advantages, num_global_valid_tokens):
    ratio = torch.exp(policy_logprobs - generator_logprobs)
    per_token = -ratio * advantages.unsqueeze(-1)
    loss = (per_token * loss_mask).sum() / num_global_valid_tokens
    return loss, {"loss/policy": loss.detach()}


class PolicyTrainer:
    def __init__(self, model, lr=1e-3):
        self.model = model
        self.optimizers = torch.optim.AdamW(model.parameters(), lr=lr)
        self.lr_schedulers = torch.optim.lr_scheduler.LambdaLR(self.optimizers, lambda s: min(1.0, (s + 1) / 5))
        self.policy_version = 0

    def forward_backward(self, local_batch, num_global_valid_tokens):
        logits = self.model(local_batch.token_ids)
        policy_logprobs = compute_logprobs(logits, local_batch.labels)
        loss, loss_metrics = policy_gradient_loss(policy_logprobs, local_batch.generator_logprobs,
                                                  local_batch.loss_mask, local_batch.advantages,
                                                  num_global_valid_tokens)
        self.optimizers.zero_grad()  # BUG
        loss.backward()
        return {k: float(v) for k, v in loss_metrics.items()}

    def optim_step(self):
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizers.step()
        self.lr_schedulers.step()
        self.policy_version += 1
        return {"policy_version": self.policy_version, "grad_norm": float(grad_norm)}


def rollout(model, num_episodes=8, length=16):
    token_ids = torch.randint(0, 64, (num_episodes, length))
    labels = torch.roll(token_ids, -1, dims=1)
    with torch.no_grad():
        generator_logprobs = compute_logprobs(model(token_ids), labels)
    rewards = (labels[:, :4] < 16).float().mean(1)
    advantages = rewards - rewards.mean()
    loss_mask = torch.ones(num_episodes, length)
    loss_mask[:, :2] = 0
    return TrainingBatch(token_ids, labels, loss_mask, generator_logprobs, advantages)


model = TinyPolicy()
trainer = PolicyTrainer(model)
num_microbatches = 4
for step in range(24):
    batches = [rollout(model) for _ in range(num_microbatches)]
    num_global_valid_tokens = sum(int(b.loss_mask.sum()) for b in batches)
    for batch in batches:
        metrics = trainer.forward_backward(batch, num_global_valid_tokens)
    out = trainer.optim_step()
    if step % 8 == 0:
        print("step", step, metrics, out)

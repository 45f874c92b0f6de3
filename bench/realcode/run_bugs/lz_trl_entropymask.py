# Source: https://github.com/huggingface/trl/issues/7221 (fix PRs #7224, #7225, #7251, #7263)
# Original: huggingface/trl trl/trainer/utils.py (entropy_from_logits, chunked) as the issue and its PRs quote it, used
# by an entropy bonus in a GRPO-style policy loss (the review on #7252: "GRPO's entropy bonus backpropagates through
# entropy_from_logits"); the policy is a tiny causal LM whose logits are masked to an allowed vocabulary with -inf,
# the rewards are synthetic
# Bug: the chunked entropy computes exp(logps) * logps; a token masked to -inf has logps = -inf and probability 0,
# and 0 * -inf is NaN: the entropy, the loss and then every weight turn NaN at the first step.
import torch
from torch import nn
from torch.nn import functional as F


def entropy_from_logits(logits, chunk_size=128):
    original_shape = logits.shape[:-1]
    flat_logits = logits.reshape(-1, logits.shape[-1])
    entropies = []
    for chunk in flat_logits.split(chunk_size, dim=0):
        logps = F.log_softmax(chunk, dim=-1)
        chunk_entropy = -(torch.exp(logps) * logps).sum(-1)  # BUG
        entropies.append(chunk_entropy)
    return torch.cat(entropies, dim=0).reshape(original_shape)


class TinyLM(nn.Module):
    def __init__(self, vocab=50, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.lm_head = nn.Linear(dim, vocab)

    def forward(self, input_ids):
        h, _ = self.rnn(self.embed(input_ids))
        return self.lm_head(h)


class GRPOTrainer:
    def __init__(self, model, allowed, entropy_coef=0.01, num_generations=4):
        self.model, self.allowed = model, allowed
        self.entropy_coef, self.num_generations = entropy_coef, num_generations
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def _get_per_token_logps_and_entropies(self, input_ids):
        logits = self.model(input_ids)[:, :-1]
        logits = logits.masked_fill(~self.allowed, float("-inf"))
        logps = torch.gather(F.log_softmax(logits, dim=-1), 2, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return logps, entropy_from_logits(logits)

    def compute_loss(self, input_ids, rewards):
        logps, entropies = self._get_per_token_logps_and_entropies(input_ids)
        grouped = rewards.view(-1, self.num_generations)
        advantages = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
        per_token_loss = -logps * advantages.view(-1, 1) - self.entropy_coef * entropies
        return per_token_loss.mean()

    def training_step(self, input_ids, rewards):
        loss = self.compute_loss(input_ids, rewards)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


torch.manual_seed(0)
allowed = torch.zeros(50, dtype=torch.bool)
allowed[:40] = True
trainer = GRPOTrainer(TinyLM(), allowed)
for step in range(20):
    completions = torch.randint(0, 40, (8, 12))
    rewards = (completions == 7).float().sum(1)
    loss = trainer.training_step(completions, rewards)
    if step % 5 == 0:
        print(step, loss, trainer.model.lm_head.weight.isnan().any().item())

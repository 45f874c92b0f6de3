# Source: https://github.com/NVIDIA-NeMo/RL/issues/158 (fixed by https://github.com/NVIDIA-NeMo/RL/pull/166)
# Original: NVIDIA-NeMo/RL nemo_reinforcer/algorithms/loss_functions.py (ClippedPGLossFn.__call__) and
# nemo_reinforcer/algorithms/utils.py (masked_mean); from the issue and PR text
# Bug: the policy-gradient loss averages per-token terms with masked_mean(x, mask) = (x * mask).sum() / mask.sum().
# A micro-batch whose token mask is all zero (every response truncated) makes it 0 / 0: the loss is NaN and its
# backward writes NaN into every gradient.
import torch

torch.manual_seed(0)


def masked_mean(values, mask, dim=None):
    if dim is None:
        return (values * mask).sum() / mask.sum()  # BUG
    return (values * mask).sum(dim) / mask.sum(dim)


class ClippedPGLossFn:
    def __init__(self, cfg):
        self.ratio_eps_min = cfg["ratio_eps_min"]
        self.ratio_eps_max = cfg["ratio_eps_max"]
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]

    def __call__(self, next_token_logits, data):
        token_mask = data["token_mask"][:, 1:]
        sample_mask = data["sample_mask"]
        mask = token_mask * sample_mask.unsqueeze(-1)
        advantages = data["advantages"][:, 1:]
        prev_logprobs = data["prev_logprobs"][:, 1:]
        reference_logprobs = data["reference_policy_logprobs"][:, 1:]

        logprobs = torch.log_softmax(next_token_logits[:, :-1], dim=-1)
        curr_logprobs = logprobs.gather(-1, data["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)

        kl = torch.exp(reference_logprobs - curr_logprobs) - (reference_logprobs - curr_logprobs) - 1
        kl = self.reference_policy_kl_penalty * masked_mean(kl, mask)

        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.ratio_eps_min, 1.0 + self.ratio_eps_max)
        loss1 = -advantages * ratios
        loss2 = -advantages * ratios_clamped
        actor_loss = masked_mean(torch.max(loss1, loss2), mask)
        loss = actor_loss + kl
        with torch.no_grad():
            probs_ratio = masked_mean(ratios.detach(), mask).item()
        return loss, {"loss": loss.item(), "probs_ratio": probs_ratio, "num_valid_samples": int(sample_mask.sum())}


class Policy(torch.nn.Module):
    def __init__(self, vocab=48, dim=64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 128), torch.nn.GELU(), torch.nn.Linear(128, vocab))

    def forward(self, input_ids):
        return self.mlp(self.embed(input_ids))


def rollout_batch(step, batch=4, seq=20, vocab=48):
    input_ids = torch.randint(0, vocab, (batch, seq))
    lengths = torch.randint(4, seq, (batch,))
    token_mask = (torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)).float()
    # responses cut at max length are dropped from the loss; some micro-batches hold nothing else
    sample_mask = (torch.rand(batch) < 0.7).float() if step % 9 else torch.zeros(batch)
    return {"input_ids": input_ids, "token_mask": token_mask, "sample_mask": sample_mask,
            "advantages": torch.randn(batch, seq), "prev_logprobs": torch.full((batch, seq), -3.9),
            "reference_policy_logprobs": torch.full((batch, seq), -3.9)}


policy = Policy()
optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
loss_fn = ClippedPGLossFn({"ratio_eps_min": 0.2, "ratio_eps_max": 0.2, "reference_policy_kl_penalty": 0.01})
for step in range(1, 41):
    data = rollout_batch(step)
    loss, metrics = loss_fn(policy(data["input_ids"]), data)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    if step % 5 == 0:
        print("step", step, metrics)

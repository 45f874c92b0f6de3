# Source: https://github.com/jingyaogong/minimind/issues/853 (fixed by https://github.com/jingyaogong/minimind/pull/854)
# Original: jingyaogong/minimind trainer/train_grpo.py (grpo_train_epoch: the policy's loss-bearing forward)
# Bug: the RL trainer wraps the policy in DistributedDataParallel, then runs the forward that the loss is built on
# through `.module`; DDP's reducer is never armed, backward all-reduces nothing, and each rank steps on its own
# gradients, so the replicas drift apart (only rank 0 is saved).
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
vocab, T, B, G = 40, 6, 4, 4


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 32)
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU())
        self.head = torch.nn.Linear(32, vocab)

    def forward(self, ids):
        return self.head(self.body(self.emb(ids)))


def per_token_logps(logits, ids):
    return torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def grpo_train_epoch(epoch, model, optimizer, prompts, gen):
    for prompt in prompts:
        with torch.no_grad():
            outputs = torch.cat([prompt.repeat(G, 1), torch.randint(0, vocab, (G, T), generator=gen)], 1)
            rewards = (outputs[:, -T:] % 3 == 0).float().mean(1)
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
        model_unwrapped = model.module if isinstance(model, DistributedDataParallel) else model  # BUG
        logits = model_unwrapped(outputs[:, :-1])
        logps = per_token_logps(logits[:, -T:], outputs[:, -T:])
        loss = -(logps.mean(1) * advantages).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


model = DistributedDataParallel(Policy())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(10 + rank)
for epoch in range(3):
    prompts = [torch.randint(0, vocab, (1, 4), generator=gen) for _ in range(12)]
    grpo_train_epoch(epoch, model, optimizer, prompts, gen)
dist.destroy_process_group()

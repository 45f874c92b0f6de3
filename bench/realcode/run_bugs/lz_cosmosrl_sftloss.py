# Source: https://github.com/nvidia-cosmos/cosmos-rl/pull/155
# Original: nvidia-cosmos/cosmos-rl the SFT trainer's loss (cross_entropy with ignore_index=-100)
# Bug: the SFT loss is F.cross_entropy(..., ignore_index=-100) with its default mean; a batch in which
# every target is masked (a prompt that fills the whole max length, so no response token survives the
# truncation) divides by zero targets: the loss is nan on every such batch (its gradient is zero).
import torch
import torch.nn.functional as F

torch.manual_seed(0)
vocab, max_len, IGNORE = 60, 12, -100


class TinyCausalLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 32)
        self.block = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
        self.lm_head = torch.nn.Linear(32, vocab)

    def forward(self, input_ids):
        h = self.embed(input_ids)
        return self.lm_head(h + self.block(h))


def sft_loss(logits, labels):
    shift_logits = logits[:, :-1].reshape(-1, logits.size(-1))
    shift_labels = labels[:, 1:].reshape(-1)
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=IGNORE)  # BUG


def collate(samples):
    ids, labels = [], []
    for prompt, response in samples:
        seq = (prompt + response)[:max_len]
        lab = ([IGNORE] * len(prompt) + response)[:max_len]
        pad = max_len - len(seq)
        ids.append(seq + [0] * pad)
        labels.append(lab + [IGNORE] * pad)
    return torch.tensor(ids), torch.tensor(labels)


class SFTTrainer:
    def __init__(self, model, lr=1e-3):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def step(self, batch):
        input_ids, labels = batch
        loss = sft_loss(self.model(input_ids), labels)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


g = torch.Generator().manual_seed(3)


def sample():
    prompt_len = int(torch.randint(3, 15, (1,), generator=g))  # some prompts are longer than max_len
    prompt = torch.randint(1, vocab, (prompt_len,), generator=g).tolist()
    return prompt, torch.randint(1, vocab, (6,), generator=g).tolist()


trainer = SFTTrainer(TinyCausalLM())
for step in range(60):
    loss = trainer.step(collate([sample()]))  # micro-batch of one sequence
    if step % 10 == 0:
        print(f"step {step} loss {loss:.4f}")

# Source: https://github.com/karpathy/llm.c/pull/500 (fixed in karpathy/llm.c@ca27eb8 "bugfix don't train on val batch")
# Original: karpathy/llm.c train_gpt2.py (the main loop: validation block and micro-batch loop)
# Bug: the training loop fetches the next batch at the end of each micro-step into x, y, and the validation
# block reads its batches into the same x, y; after every validation the first training micro-step
# back-propagates and steps on the last validation batch.
import math

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(n_embd)
        self.attn = torch.nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln_2 = torch.nn.LayerNorm(n_embd)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(n_embd, 4 * n_embd), torch.nn.GELU(),
                                       torch.nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        T = x.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab_size=128, block_size=32, n_embd=32, n_head=4, n_layer=2):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab_size, n_embd)
        self.wpe = torch.nn.Embedding(block_size, n_embd)
        self.h = torch.nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = torch.nn.LayerNorm(n_embd)
        self.lm_head = torch.nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None, return_logits=True):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1)) if targets is not None else None
        return (logits if return_logits else None), loss


class DistributedDataLoader:
    def __init__(self, tokens, B, T):
        self.tokens, self.B, self.T = tokens, B, T
        self.reset()

    def reset(self):
        self.current_position = 0

    def next_batch(self):
        B, T = self.B, self.T
        buf = self.tokens[self.current_position: self.current_position + B * T + 1]
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        self.current_position += B * T
        if self.current_position + B * T + 1 > len(self.tokens):
            self.current_position = 0
        return x, y


B, T = 4, 32
grad_accum_steps = 2
num_iterations, val_loss_every, val_max_steps = 24, 6, 2
train_loader = DistributedDataLoader(torch.randint(0, 128, (20000,)), B, T)
val_loader = DistributedDataLoader(torch.randint(64, 128, (2000,)), B, T)
model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.0, betas=(0.9, 0.95))


def get_lr(it, warmup_iters=5, learning_rate=6e-4):
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    decay_ratio = (it - warmup_iters) / (num_iterations - warmup_iters)
    return learning_rate * 0.5 * (1.0 + math.cos(math.pi * decay_ratio))


x, y = train_loader.next_batch()
for step in range(num_iterations + 1):
    last_step = step == num_iterations
    if step % val_loss_every == 0 or last_step:
        model.eval()
        val_loader.reset()
        with torch.no_grad():
            val_loss = 0.0
            for _ in range(val_max_steps):
                x, y = val_loader.next_batch()  # BUG
                _, loss = model(x, y, return_logits=False)
                val_loss += loss.item()
            val_loss /= val_max_steps
        print(f"val loss {val_loss:.4f}")
    if last_step:
        break
    model.train()
    lossf = 0.0
    for micro_step in range(grad_accum_steps):
        _, loss = model(x, y, return_logits=False)
        loss = loss / grad_accum_steps
        lossf += loss.item()
        x, y = train_loader.next_batch()
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    lr = get_lr(step)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step % 6 == 0:
        print(f"step {step + 1:4d}/{num_iterations} | train loss {lossf:.6f} | norm {norm:.4f} | lr {lr:.2e}")

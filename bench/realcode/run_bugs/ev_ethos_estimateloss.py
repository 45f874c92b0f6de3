# Source: https://github.com/ipolharvard/ethos-ares/issues/20
# Original: ipolharvard/ethos-ares src/ethos/train (the nanoGPT-style loop: estimate_loss under @torch.no_grad)
# Bug: nothing ever calls model.eval(): the periodic loss estimate (used to keep the best checkpoint) runs with
# the transformer's dropout active; no_grad turns off the graph, not dropout.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
vocab, block, n_embd = 64, 16, 32


class TinyGPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, n_embd)
        self.pos = torch.nn.Embedding(block, n_embd)
        layer = torch.nn.TransformerEncoderLayer(n_embd, 4, 4 * n_embd, dropout=0.2, batch_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.drop = torch.nn.Dropout(0.2)
        self.head = torch.nn.Linear(n_embd, vocab)

    def forward(self, idx, targets):
        x = self.drop(self.tok(idx) + self.pos(torch.arange(idx.size(1))))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(idx.size(1))
        logits = self.head(self.blocks(x, mask=mask, is_causal=True))
        return logits, F.cross_entropy(logits.view(-1, vocab), targets.view(-1))


data = {"train": torch.randint(0, vocab, (4000,)), "val": torch.randint(0, vocab, (800,))}


def get_batch(split):
    ix = torch.randint(len(data[split]) - block - 1, (8,))
    x = torch.stack([data[split][i:i + block] for i in ix])
    y = torch.stack([data[split][i + 1:i + 1 + block] for i in ix])
    return x, y


@torch.no_grad()
def estimate_loss(model, eval_iters=2):
    out = {}
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)  # BUG
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    return out


model = TinyGPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
best_val = float("inf")
for it in range(61):
    if it % 10 == 0:
        losses = estimate_loss(model)
        print(f"step {it}: train {losses['train']:.4f} val {losses['val']:.4f}")
        best_val = min(best_val, losses["val"])
    X, Y = get_batch("train")
    _, loss = model(X, Y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
print("best val", round(best_val, 4))

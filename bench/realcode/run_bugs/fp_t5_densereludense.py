# Source: https://github.com/huggingface/transformers/issues/5651 (fix: https://github.com/huggingface/transformers/pull/9487)
# Original: huggingface/transformers src/transformers/models/t5/modeling_t5.py (T5DenseReluDense.forward)
# Bug: under float16 mixed precision the feed-forward output h = self.wo(h) exceeds 65504 (66246 in the
# report) and becomes inf, which turns the loss into NaN a few layers later.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
d_model, d_ff = 32, 128


class T5DenseReluDense(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wi = torch.nn.Linear(d_model, d_ff, bias=False)
        self.wo = torch.nn.Linear(d_ff, d_model, bias=False)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, hidden_states):
        h = F.relu(self.wi(hidden_states))
        h = self.dropout(h)
        h = self.wo(h)  # BUG
        return h


class T5LayerNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + 1e-6))


class T5Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer_norm = T5LayerNorm()
        self.ff = T5DenseReluDense()

    def forward(self, x):
        return x + self.ff(self.layer_norm(x))


model = torch.nn.Sequential(torch.nn.Embedding(64, d_model), T5Block(), T5Block(), T5LayerNorm(), torch.nn.Linear(d_model, 64))
with torch.no_grad():  # pretrained T5 checkpoints carry large feed-forward weights
    for blk in (model[1], model[2]):
        blk.ff.wi.weight.normal_(0, 40.0)
        blk.ff.wo.weight.normal_(0, 40.0)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu")
for step in range(20):
    ids = torch.randint(0, 64, (4, 10))
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(ids).float().reshape(-1, 64), ids.reshape(-1))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print(step, loss.item())

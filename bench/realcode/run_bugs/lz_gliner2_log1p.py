# Source: https://github.com/fastino-ai/GLiNER2/pull/155
# Original: fastino-ai/GLiNER2 gliner2/models/boundary/losses.py (marginal_pair_consistency_loss), called from
# the boundary model's loss in gliner2/models/boundary/model.py
# Bug: the noisy-OR consistency loss guards log1p(-p) with clamp(max=1.0 - 1e-6), but under bfloat16 autocast
# 1.0 - 1e-6 rounds to exactly 1.0: a saturated pair probability gives log1p(-1) = -inf. The forward stays
# finite (exp(-inf) = 0), the backward multiplies a zero by an infinite derivative, and one step puts NaN
# gradients on the whole encoder.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def marginal_pair_consistency_loss(pair_logits, indices, valid_mask, start_logits, end_logits):
    probabilities = torch.sigmoid(pair_logits) * valid_mask.to(pair_logits.dtype)
    log_survival = torch.log1p(-probabilities.clamp(max=1.0 - 1e-6))  # BUG
    b, n = start_logits.shape

    def accumulate(index):
        total = torch.zeros(b, n, dtype=log_survival.dtype)
        total.scatter_add_(1, index, log_survival)
        count = torch.zeros_like(total)
        count.scatter_add_(1, index, valid_mask.to(total.dtype))
        return 1.0 - torch.exp(total), count > 0

    result = pair_logits.new_zeros(())
    for column, marginal in ((0, start_logits), (1, end_logits)):
        predicted, reached = accumulate(indices[..., column])
        target = torch.sigmoid(marginal.float()).to(predicted.dtype)
        result = result + (((predicted - target) ** 2) * reached).sum() / reached.sum().clamp_min(1)
    return result * 0.5


class BoundaryModel(torch.nn.Module):
    def __init__(self, vocab=200, dim=64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.encoder = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.GELU(), torch.nn.Linear(dim, dim))
        self.start_head = torch.nn.Linear(dim, 1)
        self.end_head = torch.nn.Linear(dim, 1)
        self.pair_scorer = torch.nn.Sequential(torch.nn.Linear(2 * dim, dim), torch.nn.GELU(), torch.nn.Linear(dim, 1))

    def forward(self, tokens, indices):
        h = self.encoder(self.embed(tokens))
        start_logits = self.start_head(h).squeeze(-1)
        end_logits = self.end_head(h).squeeze(-1)
        batch = torch.arange(tokens.shape[0])[:, None]
        pair = torch.cat([h[batch, indices[..., 0]], h[batch, indices[..., 1]]], dim=-1)
        return self.pair_scorer(pair).squeeze(-1), start_logits, end_logits

    def compute_loss(self, tokens, indices, valid_mask, gold):
        pair_logits, start_logits, end_logits = self(tokens, indices)
        pair_loss = F.binary_cross_entropy_with_logits(pair_logits.float(), gold, weight=valid_mask.float())
        consistency = marginal_pair_consistency_loss(pair_logits, indices, valid_mask, start_logits, end_logits)
        return pair_loss + 0.1 * consistency


def make_batch(batch=8, length=24, spans=40):
    tokens = torch.randint(0, 200, (batch, length))
    start = torch.randint(0, length - 4, (batch, spans))
    indices = torch.stack([start, start + torch.randint(0, 4, (batch, spans))], dim=-1)
    valid_mask = torch.rand(batch, spans) > 0.1
    gold = (tokens.gather(1, start) < 40).float()
    return tokens, indices, valid_mask, gold


model = BoundaryModel()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(60):
    tokens, indices, valid_mask, gold = make_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.compute_loss(tokens, indices, valid_mask, gold)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print("step", step, "loss", round(loss.item(), 4))

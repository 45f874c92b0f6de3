# Source: https://github.com/bowang-lab/Transformer-GCN-QA/pull/32
# Original: bowang-lab/Transformer-GCN-QA src/models.py (TransformerGCNQA.forward)
# Bug: the candidate scores are turned into probabilities (exp of log_softmax) and passed to
# nn.CrossEntropyLoss, a second softmax that flattens the gradient; the fix passes the masked logits.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class TransformerGCNQA(torch.nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.gcn = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.Tanh(), torch.nn.Linear(dim, dim))
        self.score = torch.nn.Linear(2 * dim, 1)

    def forward(self, query, candidates, mask):
        nodes = self.gcn(candidates)
        q = query[:, None, :].expand_as(nodes)
        scores = self.score(torch.cat([q, nodes], -1)).squeeze(-1)
        scores = scores.masked_fill(~mask, -1e4)
        return torch.exp(F.log_softmax(scores, dim=-1))  # BUG


model = TransformerGCNQA()
criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    query, candidates = torch.randn(8, 16), torch.randn(8, 6, 16)
    mask = torch.ones(8, 6, dtype=torch.bool)
    mask[:, 5] = False
    answer = torch.randint(0, 5, (8,))
    optimizer.zero_grad()
    loss = criterion(model(query, candidates, mask), answer)
    loss.backward()
    optimizer.step()
print("loss", loss.item())

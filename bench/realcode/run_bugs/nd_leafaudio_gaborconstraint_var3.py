# Source: https://github.com/denfed/leaf-audio-pytorch/issues/3 (variant of nd_leafaudio_gaborconstraint, run13c)
# Original: none (a variant): the same family in another shape, a retrieval trainer class holding self.model and
# self.optimizer, whose context-encoding method runs the context tower under torch.no_grad(); synthetic queries
# Bug: the context tower is in the optimizer and meant to be trained jointly, but the trainer encodes the contexts in
# a method wrapped in torch.no_grad() (copied from the evaluation path): the tower's output is a constant and its
# parameters never receive a gradient; only the query tower learns.
import torch
from torch import nn
from torch.nn import functional as F


class DualEncoder(nn.Module):
    def __init__(self, dim=24, emb=16):
        super().__init__()
        self.query_tower = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, emb))
        self.context_tower = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, emb))


class RetrievalTrainer:
    def __init__(self, model, lr=1e-3, temperature=0.1):
        self.model = model
        self.temperature = temperature
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def encode_queries(self, q):
        return F.normalize(self.model.query_tower(q), dim=-1)

    def encode_contexts(self, c):
        with torch.no_grad():  # BUG
            return F.normalize(self.model.context_tower(c), dim=-1)

    def train_step(self, q, c):
        scores = self.encode_queries(q) @ self.encode_contexts(c).T / self.temperature
        loss = F.cross_entropy(scores, torch.arange(q.shape[0]))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


torch.manual_seed(0)
model = DualEncoder()
trainer = RetrievalTrainer(model)
proj = torch.randn(24, 24)
for epoch in range(3):
    for i in range(15):
        c = torch.randn(16, 24)
        q = c @ proj * 0.3 + 0.1 * torch.randn(16, 24)
        loss = trainer.train_step(q, c)
    print(epoch, round(loss, 4), "context grad", model.context_tower[0].weight.grad)

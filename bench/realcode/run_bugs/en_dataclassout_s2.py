# Synthetic: state 2 of run14 (written for torchdoctor's dev set, no public source of its own)
# Bug: the model returns a dataclass of tensors; the validation loop runs its forwards without torch.no_grad(), so
# every validation batch builds a graph nobody backpropagates.
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


@dataclass
class SegOutput:
    logits: torch.Tensor
    embedding: torch.Tensor


class Segmenter(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Dropout(0.1))
        self.classifier = nn.Linear(48, 4)

    def forward(self, x):
        e = self.encoder(x)
        return SegOutput(logits=self.classifier(e), embedding=e)


def validate(model, loader):
    model.eval()
    hits = total = 0
    for x, y in loader:
        out = model(x)  # BUG
        hits += int((out.logits.argmax(-1) == y).sum())
        total += y.numel()
    model.train()
    return hits / total


model = Segmenter()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
train_loader = [(torch.randn(32, 12), torch.randint(0, 4, (32,))) for _ in range(10)]
val_loader = [(torch.randn(32, 12), torch.randint(0, 4, (32,))) for _ in range(4)]
for epoch in range(4):
    for x, y in train_loader:
        out = model(x)
        loss = F.cross_entropy(out.logits, y) + 1e-3 * out.embedding.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} val acc {validate(model, val_loader):.3f}")

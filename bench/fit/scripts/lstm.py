"""A word-level LSTM language model with a DataLoader over synthetic token streams (Adam)."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
vocab, seq = 32000, 256


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, 512)
        self.rnn = nn.LSTM(512, 1024, num_layers=2, batch_first=True, dropout=0.2)
        self.out = nn.Linear(1024, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.embed(x))
        return self.out(h)


tokens = torch.randint(0, vocab, (args.batch_size * args.steps, seq + 1))
loader = DataLoader(TensorDataset(tokens), batch_size=args.batch_size, shuffle=True, drop_last=True)
model = LM().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
for step, (batch,) in enumerate(loader):
    batch = batch.to(device)
    logits = model(batch[:, :-1])
    loss = criterion(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    optimizer.step()
    if step % 10 == 0:
        print(step, loss.item())

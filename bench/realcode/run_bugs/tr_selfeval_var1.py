# Variant of tr_lerobot_evalpolicy (same bug, another shape; written for torchdoctor's dev set, no public source)
# Bug: a runner class switches its model to train mode at the top of each epoch and, every 15 iterations,
# logs a held-out score through a method that calls self.m.eval() and returns without restoring the mode;
# the rest of the epoch trains with dropout off.
import torch
import torch.nn as nn

torch.manual_seed(0)


class Runner:
    def __init__(self, m, o, crit, held):
        self.m = m
        self.o = o
        self.crit = crit
        self.held = held
        self.n = 0

    def _score(self):
        self.m.eval()
        with torch.no_grad():
            return sum(float(self.crit(self.m(x), y)) for x, y in self.held) / len(self.held)

    def _maybe_log(self, loss):
        if self.n % 15 == 0:
            print(f"iter {self.n} loss {loss:.4f} held {self._score():.4f}")

    def run(self, batches, epochs):
        for ep in range(epochs):
            self.m.train()
            for x, y in batches:
                self.o.zero_grad()
                loss = self.crit(self.m(x), y)
                loss.backward()
                self.o.step()
                self.n += 1
                self._maybe_log(loss.item())  # BUG


m = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 5))
batches = [(torch.randn(16, 20), torch.randint(0, 5, (16,))) for _ in range(45)]
held = [(torch.randn(16, 20), torch.randint(0, 5, (16,))) for _ in range(2)]
Runner(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), nn.CrossEntropyLoss(), held).run(batches, 2)

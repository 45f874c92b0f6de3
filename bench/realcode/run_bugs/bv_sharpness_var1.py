# Variant of bv_bist_testloss (same bug, another shape; written for torchdoctor's dev set, no public source of its own)
# Bug: a trainer class measures a "sharpness" metric on validation batches every few steps: it evaluates under
# torch.enable_grad() and calls backward to read the gradient norm, and nothing clears those gradients; the
# training step zeroes only after its own step, so the next update applies the validation gradients.
import torch
import torch.nn as nn

torch.manual_seed(0)


class Trainer:
    def __init__(self, net, o, crit, every=10):
        self.net = net
        self.o = o
        self.crit = crit
        self.every = every
        self.it = 0

    def step(self, x, y):
        out = self.net(x)
        loss = self.crit(out, y)
        loss.backward()
        self.o.step()
        self.o.zero_grad()
        return loss.item()

    @torch.no_grad()
    def probe(self, batches):
        self.net.eval()
        sq = 0.0
        with torch.enable_grad():
            for x, y in batches:
                lv = self.crit(self.net(x), y)
                lv.backward()  # BUG
        for p in self.net.parameters():
            sq += float(p.grad.pow(2).sum())
        self.net.train()
        return sq ** 0.5

    def fit(self, data, held, epochs):
        self.net.train()
        for ep in range(epochs):
            for x, y in data:
                v = self.step(x, y)
                self.it += 1
                if self.it % self.every == 0:
                    print(f"it {self.it} loss {v:.4f} sharpness {self.probe(held):.4f}")


net = nn.Sequential(nn.Linear(10, 48), nn.ReLU(), nn.Dropout(0.2), nn.Linear(48, 3))
data = [(torch.randn(16, 10), torch.randint(0, 3, (16,))) for _ in range(20)]
held = [(torch.randn(16, 10), torch.randint(0, 3, (16,))) for _ in range(3)]
Trainer(net, torch.optim.SGD(net.parameters(), lr=0.05), nn.CrossEntropyLoss()).fit(data, held, epochs=3)

# Synthetic: state 2 of run14 (written for torchdoctor's dev set, no public source of its own)
# Bug: the model returns ((logits, aux_logits), extras); evaluate() switches it to eval mode and the training loop
# never calls model.train() again, so from the second epoch on dropout and batch norm train in eval mode.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 40), nn.BatchNorm1d(40), nn.ReLU(), nn.Dropout(0.2))
        self.main = nn.Linear(40, 5)
        self.side = nn.Linear(40, 5)

    def forward(self, x):
        h = self.trunk(x)
        return (self.main(h), self.side(h)), {"features": h}


@torch.no_grad()
def evaluate(net, batches):
    net.eval()
    right = 0
    for x, y in batches:
        (logits, _), _ = net(x)
        right += int((logits.argmax(1) == y).sum())
    return right


net = TwoHeads()
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
train = [(torch.randn(24, 10), torch.randint(0, 5, (24,))) for _ in range(10)]
held = [(torch.randn(24, 10), torch.randint(0, 5, (24,))) for _ in range(3)]
net.train()
for epoch in range(4):
    for x, y in train:
        (logits, aux), _ = net(x)
        loss = F.cross_entropy(logits, y) + 0.4 * F.cross_entropy(aux, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    correct = evaluate(net, held)  # BUG
    print(f"epoch {epoch} correct {correct}")

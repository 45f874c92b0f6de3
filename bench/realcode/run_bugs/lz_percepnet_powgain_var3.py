# Source: https://github.com/jzi040941/PercepNet/issues/37 (variant of lz_percepnet_powgain, written by run13c)
# Original: none (a variant): the same family in another shape, a metric-learning trainer class holding self.net and
# self.opt, whose contrastive loss is a method that calls a distance method; the pairs are synthetic
# Bug: the pair distance is sqrt(sum((a - b) ** 2)); pairs made of a sample and an identical copy (augmentation that
# left the sample unchanged) have distance exactly 0, the derivative of sqrt at 0 is infinite and the backward makes
# NaN gradients: the loss stays finite but the weights turn NaN at the first such batch.
import torch
from torch import nn


class SiameseTrainer:
    def __init__(self, net, margin=1.0, lr=1e-3):
        self.net = net
        self.margin = margin
        self.opt = torch.optim.Adam(net.parameters(), lr=lr)

    def _distance(self, a, b):
        return torch.sqrt(((a - b) ** 2).sum(-1))  # BUG

    def _contrastive(self, a, b, same):
        d = self._distance(a, b)
        return (same * d ** 2 + (1 - same) * torch.clamp(self.margin - d, min=0) ** 2).mean()

    def step(self, x1, x2, same):
        loss = self._contrastive(self.net(x1), self.net(x2), same)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    def fit(self, batches, epochs):
        for epoch in range(epochs):
            losses = [self.step(*b) for b in batches]
            print(epoch, sum(losses) / len(losses), next(self.net.parameters()).isnan().any().item())


def augment(x, g, p_keep):
    keep = torch.rand(x.shape[0], 1, generator=g) < p_keep
    return torch.where(keep, x, x + 0.1 * torch.randn(x.shape, generator=g))


torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
batches = []
for i in range(15):
    x = torch.randn(16, 10, generator=g)
    same = (torch.rand(16, generator=g) < 0.5).float()
    other = torch.randn(16, 10, generator=g)
    partner = torch.where(same.bool().unsqueeze(1), augment(x, g, 0.2 if i >= 6 else 0.0), other)
    batches.append((x, partner, same))
net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 8))
SiameseTrainer(net).fit(batches, epochs=2)

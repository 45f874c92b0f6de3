# Source: https://github.com/pytorch/pytorch/issues/52248
# Original: none: the shape (torch.where keeping the valid branch of an op that is inf elsewhere) in an
# entropy bonus over masked attention weights, a helper of the loss; synthetic data
# Bug: the masked weights are exactly 0, so `probs * log(probs)` is NaN there; torch.where discards it in the
# forward (the loss stays finite), but the backward multiplies the discarded branch's zero gradient by log's
# infinite derivative at 0: every gradient is NaN from step 1 and the weights turn NaN.
import torch
from torch import nn


def entropy_bonus(scores, mask):
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    plogp = torch.where(mask, probs * torch.log(probs), torch.zeros_like(probs))  # BUG
    return -plogp.sum(-1).mean()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 6))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    x = torch.randn(32, 8)
    mask = torch.rand(32, 6) > 0.3
    mask[:, 0] = True
    scores = model(x)
    loss = (scores ** 2).mean() - 0.01 * entropy_bonus(scores, mask)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("loss", loss.item(), "weights NaN", model[0].weight.isnan().any().item())

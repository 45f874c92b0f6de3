# Source: https://github.com/huggingface/trl/issues/7221 (variant of lz_trl_entropymask, written by run13c)
# Original: none (a variant): the same family in another shape, a distillation criterion class defined in the entry
# script and called from a train_one_epoch(m, loader, o, crit) in another module of a small package (lzvar_engine)
# Bug: the criterion computes KL(teacher || student) as sum(p * log(p / q)); the teacher's soft labels are sparse
# (exact zeros outside its top classes), and 0 * log(0 / q) is 0 * -inf = NaN: the first batch's loss is NaN and the
# weights turn NaN; the first non-finite value is made in the criterion's forward.
import torch
from torch import nn
from torch.nn import functional as F

from lzvar_engine.loop import train_one_epoch


class SoftKL(nn.Module):
    def __init__(self, temperature=2.0):
        super().__init__()
        self.t = temperature

    def forward(self, logits, p):
        q = F.softmax(logits / self.t, dim=-1)
        return (p * torch.log(p / q)).sum(-1).mean() * self.t ** 2  # BUG


def sparse_teacher(x, w, k=3):
    scores = x @ w
    top = scores.topk(k, dim=-1)
    soft = torch.zeros_like(scores)
    return soft.scatter(-1, top.indices, F.softmax(top.values, dim=-1))


torch.manual_seed(0)
w_teacher = torch.randn(20, 10)
xs = torch.randn(12, 16, 20)
loader = [(x, sparse_teacher(x, w_teacher)) for x in xs]
m = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
o = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
crit = SoftKL()
for epoch in range(3):
    train_one_epoch(m, loader, o, crit, epoch)

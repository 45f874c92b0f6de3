# Source: https://github.com/HorizonRobotics/alf/pull/1788
# Original: HorizonRobotics/alf alf/algorithms/algorithm.py (update_with_gradient) and the optimizer wrapper
# Bug: after PR #1780 the algorithm calls optimizer.zero_grad() before every optimizer.step(); with gradient
# accumulation the wrapper applies the update only every N calls, so the zero_grad discards the micro-batches
# accumulated since the last real update and each update uses one micro-batch's gradient.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class AccumulatingOptimizer:
    """Wraps a torch optimizer: step() applies the summed gradient once every `accum` calls."""

    def __init__(self, optimizer, accum):
        self.optimizer, self.accum, self.calls = optimizer, accum, 0

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        self.calls += 1
        if self.calls % self.accum == 0:
            self.optimizer.step()


class Algorithm:
    def __init__(self, net, accum):
        self.net = net
        self.optimizer = AccumulatingOptimizer(torch.optim.Adam(net.parameters(), lr=1e-3), accum)
        self.accum = accum

    def update_with_gradient(self, loss):
        self.optimizer.zero_grad()  # BUG
        (loss / self.accum).backward()
        self.optimizer.step()

    def train_iter(self, obs, returns):
        value = self.net(obs).squeeze(-1)
        loss = F.smooth_l1_loss(value, returns)
        self.update_with_gradient(loss)
        return loss.item()


algorithm = Algorithm(torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)), accum=4)
for it in range(160):
    loss = algorithm.train_iter(torch.randn(32, 10), torch.randn(32))
    if it % 40 == 0:
        print(it, round(loss, 4))

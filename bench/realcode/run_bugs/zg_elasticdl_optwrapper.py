# Source: https://github.com/sql-machine-learning/elasticdl/pull/2426
# Original: sql-machine-learning/elasticdl elasticdl/python/allreduce/torch_optimizer.py
# (_ElasticDistributedOptimizer.zero_grad, step; ElasticDistributedOptimizer), read at 044fc5b
# Bug: the wrapper's zero_grad() returns early while gradients are not to be updated, and its call of the base
# optimizer's zero_grad sits inside the "handles still pending" branch, after the raise: it never runs. The user's
# loop calls optimizer.zero_grad() every step, yet gradients accumulate across all steps.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class _ElasticDistributedOptimizer(torch.optim.Optimizer):
    """Keeps a fixed global batch: steps only every backward_passes_per_step calls when fixed_batch_size is set."""

    def __init__(self, params, backward_passes_per_step=1, fixed_batch_size=False):
        super(self.__class__, self).__init__(params)
        self.backward_passes_per_step = backward_passes_per_step
        self._fixed_batch_size = fixed_batch_size
        self._handles = {}
        self._iter_step = 0
        self._update_gradients = True

    def step(self, closure=None):
        self._iter_step += 1
        self._update_gradients = not (self._fixed_batch_size and self._iter_step % self.backward_passes_per_step != 0)
        if not self._update_gradients:
            return None
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=True):
        if not self._update_gradients:
            return
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step()")
            return super(self.__class__, self).zero_grad()  # BUG


def ElasticDistributedOptimizer(optimizer, backward_passes_per_step=1, fixed_batch_size=False):
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_ElasticDistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, backward_passes_per_step, fixed_batch_size)


def train_one_batch(model, optimizer, features, labels):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(features), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


model = torch.nn.Sequential(torch.nn.Linear(28, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = ElasticDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
weights = torch.randn(28, 10)
for step in range(80):
    features = torch.randn(32, 28)
    loss = train_one_batch(model, optimizer, features, (features @ weights).argmax(1))
    if step % 20 == 0:
        print("step", step, "loss", loss)

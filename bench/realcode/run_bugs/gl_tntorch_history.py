# Source: https://github.com/rballester/tntorch/pull/19
# Original: rballester/tntorch tntorch/optimize.py (optimize)
# Bug: the high-level fitting helper keeps every iteration's total loss tensor (graph attached) in a local
# list used for the convergence test; the list grows by one graph per iteration for the whole fit.
import time
from functools import reduce

import torch

torch.manual_seed(0)


def optimize(parameters, loss_function, tol=1e-6, max_iter=150, print_freq=50):
    optimizer = torch.optim.Adam(parameters, lr=1e-2)
    losses = []
    start = time.time()
    for it in range(max_iter):
        optimizer.zero_grad()
        loss = loss_function()
        if not isinstance(loss, (tuple, list)):
            loss = [loss]
        losses.append(reduce(lambda x, y: x + y, loss))  # BUG
        if it >= 2 and (losses[-2] - losses[-1]).abs() < tol:
            break
        if it % print_freq == 0:
            print(f"iter {it}: loss {losses[-1].item():.5f} ({time.time() - start:.2f} s)")
        losses[-1].backward()
        optimizer.step()
    return losses[-1].item()


# a rank-8 factorisation of a 32 x 32 x 32 tensor (three factor matrices), fitted to sampled entries
target = torch.randn(32, 32, 32)
factors = [torch.randn(32, 8, requires_grad=True) for _ in range(3)]


def fit_loss():
    full = torch.einsum("ir,jr,kr->ijk", *factors)
    return ((full - target) ** 2).mean(), 1e-4 * sum((f ** 2).sum() for f in factors)


print("final", round(optimize(factors, fit_loss), 4))

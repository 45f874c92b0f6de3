# Source: https://github.com/StanfordASL/neural-network-lyapunov/pull/140
# Original: StanfordASL/neural-network-lyapunov neural_network_lyapunov/train_lyapunov.py (the closure handed to the
# steepest-descent line search)
# Bug: the closure records every loss it computes in the trainer's losses list as a tensor; the line search calls
# it for each trial step without a backward, so each recorded loss keeps its whole graph (and the activations it
# saved) alive for the rest of training (the fix: the closure returns the loss, the list stores floats).
import torch

torch.manual_seed(0)
x_dim = 2


class LyapunovNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(x_dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x) - self.net(torch.zeros(1, x_dim)) + 0.1 * x.abs().sum(-1, keepdim=True)


def dynamics(x):
    A = torch.tensor([[0.9, 0.2], [-0.2, 0.9]])
    return x @ A.T


def line_search_sd(params, closure, t0=1.0, beta=0.5, c=1e-4, max_iter=8):
    loss0 = closure()
    grads = torch.autograd.grad(loss0, params)
    start = [p.detach().clone() for p in params]
    g2 = sum((g * g).sum() for g in grads)
    t = t0
    for _ in range(max_iter):
        with torch.no_grad():
            for p, p0, g in zip(params, start, grads):
                p.copy_(p0 - t * g)
        if closure() < loss0 - c * t * g2:
            return t
        t *= beta
    return t


class TrainLyapunov:
    def __init__(self, V):
        self.V = V
        self.losses = []

    def total_loss(self, x):
        v, v_next = self.V(x), self.V(dynamics(x))
        positivity = torch.relu(0.01 * x.abs().sum(-1, keepdim=True) - v).mean()
        derivative = torch.relu(v_next - v + 0.01 * v).mean()
        return positivity + derivative

    def train(self, x_samples, iterations):
        params = list(self.V.parameters())

        def closure():
            loss = self.total_loss(x_samples)
            self.losses.append(loss)  # BUG
            return loss

        for it in range(iterations):
            t = line_search_sd(params, closure)
            if it % 20 == 0:
                print(it, "loss", self.losses[-1].item(), "step", t)


x_samples = torch.rand(512, x_dim) * 2 - 1
TrainLyapunov(LyapunovNet()).train(x_samples, 80)

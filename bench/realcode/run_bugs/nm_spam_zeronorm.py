# Source: https://github.com/kozistr/pytorch_optimizer/pull/431 (commit 45e00ec)
# Original: kozistr/pytorch_optimizer pytorch_optimizer/optimizer/spam.py (StableSPAM.step), read at 45e00ec^
# Bug: StableSPAM rescales each gradient to a running norm with grad.div_(grad_norm). A parameter whose gradient is
# exactly zero (here the residual branches behind a zero-initialised ReZero gate, at the first step) divides 0 by 0:
# its update is NaN, the weights turn NaN, and every later loss is NaN. The fix skips parameters with a zero norm.
import math

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class StableSPAM(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, gamma1=0.7, gamma2=0.9, theta=0.999):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.gamma1, self.gamma2, self.theta = gamma1, gamma2, theta

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            bias_correction1 = 1.0 - beta1 ** group["step"]
            bias_correction2_sq = math.sqrt(1.0 - beta2 ** group["step"])
            step_size = group["lr"] / bias_correction1
            theta_t = 1.0 - self.theta ** group["step"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(grad)
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                    state["m_norm_t"] = torch.zeros(1)
                    state["v_norm_t"] = torch.zeros(1)
                    state["m_max_t"] = torch.zeros(1)
                max_grad = torch.max(grad.abs())
                state["m_max_t"].lerp_(max_grad, weight=1.0 - self.theta)
                m_max_hat = state["m_max_t"] / theta_t
                mask = grad.abs() > m_max_hat
                if mask.sum() > 0:
                    grad[mask] = grad[mask] / max_grad * m_max_hat
                grad_norm = torch.norm(grad)
                m_norm_t, v_norm_t = state["m_norm_t"], state["v_norm_t"]
                m_norm_t.lerp_(grad_norm, weight=1.0 - self.gamma1)
                v_norm_t.lerp_(grad_norm.pow(2), weight=1.0 - self.gamma2)
                m_norm_hat = m_norm_t / (1.0 - self.gamma1 ** group["step"])
                v_norm_hat = v_norm_t / (1.0 - self.gamma2 ** group["step"])
                c_norm_t = m_norm_hat / (v_norm_hat.sqrt() + group["eps"])
                grad.div_(grad_norm).mul_(c_norm_t)  # BUG
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                de_nom = exp_avg_sq.sqrt().div_(bias_correction2_sq).add_(group["eps"])
                p.addcdiv_(exp_avg, de_nom, value=-step_size)
        return None


class ReZeroBlock(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ff = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
        self.alpha = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return x + self.alpha * self.ff(x)


model = torch.nn.Sequential(torch.nn.Linear(16, 64), ReZeroBlock(64), ReZeroBlock(64), torch.nn.Linear(64, 4))
optimizer = StableSPAM(model.parameters(), lr=1e-3)
w = torch.randn(16, 4)
for step in range(40):
    x = torch.randn(32, 16)
    loss = F.cross_entropy(model(x), (x @ w).argmax(1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print("step", step, "loss", loss.item())

# Source: https://github.com/Koratahiu/Advanced_Optimizers/pull/5
# Original: Koratahiu/Advanced_Optimizers adv_optm/optim/Prodigy_adv.py (step)
# Bug: the optimizer's step reads its distance estimates with .item(), so every optimizer step blocks the host
# until the device queue drains; the PR keeps them on the device (it also removed an implicit sync in OrthoGrad,
# a tensor passed as alpha, not reproduced here).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class ProdigyAdv(torch.optim.Optimizer):
    def __init__(self, params, lr=1.0, betas=(0.9, 0.99), d0=1e-3, eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, d=d0, d0=d0, d_max=d0, d_numerator=0.0, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            d, lr = group["d"], group["lr"]
            d_numerator = torch.zeros(())
            d_denom = torch.zeros(())
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["s"] = torch.zeros_like(p)
                    state["p0"] = p.detach().clone()
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                grad = p.grad
                d_numerator += (d / group["d0"]) * d * lr * torch.dot(grad.flatten(), (state["p0"] - p).flatten())
                state["exp_avg"].mul_(beta1).add_(grad, alpha=d * (1 - beta1))
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=d * d * (1 - beta2))
                state["s"].mul_(beta2 ** 0.5).add_(grad, alpha=(d / group["d0"]) * d * lr)
                d_denom += state["s"].abs().sum()
            group["d_numerator"] = group["d_numerator"] * beta2 ** 0.5 + d_numerator.item()  # BUG
            d_hat = group["d_numerator"] / d_denom.item()
            group["d_max"] = max(group["d_max"], d_hat)
            group["d"] = max(d, min(d_hat, group["d_max"]))
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                denom = state["exp_avg_sq"].sqrt().add_(d * group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-d * lr)
        return None


model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU(),
                            torch.nn.Linear(128, 1))
optimizer = ProdigyAdv(model.parameters())
for step in range(200):
    x = torch.randn(64, 32)
    y = x[:, :4].sum(1, keepdim=True)
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
print("final loss", loss.item(), "d", optimizer.param_groups[0]["d"])

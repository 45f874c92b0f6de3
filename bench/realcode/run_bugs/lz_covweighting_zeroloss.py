# Source: https://github.com/rickgroen/cov-weighting/issues/3
# Original: rickgroen/cov-weighting losses/covweighting_loss.py (CoVWeightingLoss.forward) and losses/base_loss.py
# Bug: the CoV weighting divides each loss by its running mean (L / L0) and the ratios' std by their mean with no
# epsilon; a loss that is exactly zero (here the disparity smoothness term of a zero-initialised disparity head)
# gives 0/0 at the first iteration, the running statistics turn NaN and so do the weights and the total loss
# ("exactly the problem", the reporter confirmed; the maintainer's fix is a small constant in the denominator).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class BaseLoss(torch.nn.Module):
    def __init__(self, num_losses):
        super().__init__()
        self.num_losses = num_losses
        self.train = True

    def forward(self, pred, target):
        disp, recon = pred
        l1 = (recon - target).abs().mean()
        ssim_like = 1 - F.cosine_similarity(recon.flatten(1), target.flatten(1)).mean()
        smooth = (disp[:, :, :, 1:] - disp[:, :, :, :-1]).abs().mean()
        return [l1, ssim_like, smooth]


class CoVWeightingLoss(BaseLoss):
    def __init__(self, num_losses=3, mean_decay_param=1.0):
        super().__init__(num_losses)
        self.mean_decay_param = mean_decay_param
        self.current_iter = -1
        self.alphas = torch.zeros(num_losses)
        self.running_mean_L = torch.zeros(num_losses)
        self.running_mean_l = torch.zeros(num_losses)
        self.running_S_l = torch.zeros(num_losses)
        self.running_std_l = None

    def forward(self, pred, target):
        unweighted_losses = super().forward(pred, target)
        L = torch.stack([x.detach() for x in unweighted_losses])
        self.current_iter += 1
        L0 = L.clone() if self.current_iter == 0 else self.running_mean_L
        ratios = L / L0  # BUG
        if self.current_iter <= 1:
            self.alphas = torch.ones(self.num_losses) / self.num_losses
        else:
            ls = self.running_std_l / self.running_mean_l
            self.alphas = ls / torch.sum(ls)
        mean_param = 0.0 if self.current_iter == 0 else (1. - 1 / (self.current_iter + 1))
        x_l = ratios.clone().detach()
        new_mean_l = mean_param * self.running_mean_l + (1 - mean_param) * x_l
        self.running_S_l += (x_l - self.running_mean_l) * (x_l - new_mean_l)
        self.running_mean_l = new_mean_l
        self.running_std_l = torch.sqrt(self.running_S_l / (self.current_iter + 1) + 1e-8)
        self.running_mean_L = mean_param * self.running_mean_L + (1 - mean_param) * L.clone().detach()
        return sum(self.alphas[i] * unweighted_losses[i] for i in range(len(unweighted_losses)))


class DepthNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
        self.disp = torch.nn.Conv2d(8, 1, 3, padding=1)
        self.recon = torch.nn.Conv2d(8, 3, 3, padding=1)
        torch.nn.init.zeros_(self.disp.weight)
        torch.nn.init.zeros_(self.disp.bias)

    def forward(self, x):
        h = self.enc(x)
        return self.disp(h), self.recon(h)


model = DepthNet()
criterion = CoVWeightingLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
for step in range(30):
    left, right = torch.rand(4, 3, 16, 16, generator=g), torch.rand(4, 3, 16, 16, generator=g)
    loss = criterion(model(left), right)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print("step", step, "loss", loss.item())

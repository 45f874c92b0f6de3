# Source: https://github.com/wangle53/CSA-CDGAN/issues/5
# Original: wangle53/CSA-CDGAN train.py (train_network)
# Bug: pred_fake = netd(fake).detach(), so the adversarial part of the generator loss (err_d_fake) cannot
# update the generator; only the L1 reconstruction term does.
import torch

torch.manual_seed(0)
netg = torch.nn.Sequential(torch.nn.Conv2d(6, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 1, 1), torch.nn.Sigmoid())
netd = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 4, stride=4), torch.nn.Flatten(), torch.nn.Linear(64, 1), torch.nn.Sigmoid())
optimizer_d = torch.optim.Adam(netd.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizer_g = torch.optim.Adam(netg.parameters(), lr=2e-4, betas=(0.5, 0.999))
l_con, l_bce = torch.nn.L1Loss(), torch.nn.BCELoss()

for i in range(40):
    x1, x2, gt = torch.randn(4, 3, 16, 16), torch.randn(4, 3, 16, 16), (torch.rand(4, 1, 16, 16) > 0.8).float()
    x = torch.cat((x1, x2), 1)
    real_label, fake_label = torch.ones(4, 1), torch.zeros(4, 1)
    fake = netg(x)
    pred_real = netd(gt)
    pred_fake = netd(fake).detach()  # BUG
    err_d_fake = l_bce(pred_fake, fake_label)
    err_g = l_con(fake, gt)
    err_g_total = 50 * err_g + 1 * err_d_fake
    pred_fake_ = netd(fake.detach())
    err_d_total = (l_bce(pred_real, real_label) + l_bce(pred_fake_, fake_label)) * 0.5
    optimizer_g.zero_grad()
    err_g_total.backward(retain_graph=True)
    optimizer_g.step()
    optimizer_d.zero_grad()
    err_d_total.backward()
    optimizer_d.step()
print("done")

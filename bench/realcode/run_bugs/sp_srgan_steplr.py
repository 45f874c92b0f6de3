# Source: https://github.com/Lornatang/SRGAN-PyTorch/issues/1
# Original: Lornatang/SRGAN-PyTorch trainer.py (train_gan)
# Bug: the StepLR schedulers (step_size = epochs // 2, meant per epoch) are stepped every batch, so the
# LR collapses towards 0 after a few steps.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
epochs = 8
netG = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.PReLU(), torch.nn.Conv2d(8, 3, 3, padding=1))
netD = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.LeakyReLU(0.2), torch.nn.Flatten(), torch.nn.Linear(8 * 7 * 7, 1))
optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-4)
optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-4)
schedulerG = torch.optim.lr_scheduler.StepLR(optimizerG, step_size=epochs // 2, gamma=0.1)
schedulerD = torch.optim.lr_scheduler.StepLR(optimizerD, step_size=epochs // 2, gamma=0.1)


def train_gan(epoch, loader, schedulerD, schedulerG):
    for lr_img, hr_img in loader:
        sr = netG(lr_img)
        optimizerD.zero_grad()
        d_loss = F.softplus(netD(sr.detach())).mean() + F.softplus(-netD(hr_img)).mean()
        d_loss.backward()
        optimizerD.step()
        optimizerG.zero_grad()
        g_loss = F.mse_loss(sr, hr_img) + 1e-3 * F.softplus(-netD(sr)).mean()
        g_loss.backward()
        optimizerG.step()
        schedulerD.step()  # BUG
        schedulerG.step()


loader = [(torch.randn(4, 3, 16, 16), torch.randn(4, 3, 16, 16)) for _ in range(10)]
for epoch in range(epochs):
    train_gan(epoch, loader, schedulerD, schedulerG)
print("lr", optimizerG.param_groups[0]["lr"])

# Variant of bv_bist_testloss (same bug, another shape; written for torchdoctor's dev set, no public source of its own)
# Bug: a GAN's per-epoch evaluation copies the discriminator update of the training step to measure its
# accuracy on held-out images: it backpropagates and steps optimizerD on them in eval mode. The netG.zero_grad()
# it keeps from the training step clears only the generator's gradients.
import torch
import torch.nn as nn

torch.manual_seed(0)
nz = 8
netG = nn.Sequential(nn.Linear(nz, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
netD = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Dropout(0.3), nn.Linear(32, 1))
criterion = nn.BCEWithLogitsLoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
train_images = [torch.randn(16, 16).tanh() for _ in range(10)]
held_images = [torch.randn(16, 16).tanh() for _ in range(3)]


def d_step(real):
    b = real.size(0)
    netD.zero_grad()
    errD_real = criterion(netD(real), torch.ones(b, 1))
    errD_real.backward()
    fake = netG(torch.randn(b, nz))
    errD_fake = criterion(netD(fake.detach()), torch.zeros(b, 1))
    errD_fake.backward()
    return fake, errD_real + errD_fake


for epoch in range(4):
    netG.train()
    netD.train()
    for real in train_images:
        fake, errD = d_step(real)
        optimizerD.step()
        netG.zero_grad()
        errG = criterion(netD(fake), torch.ones(real.size(0), 1))
        errG.backward()
        optimizerG.step()
    netG.eval()
    netD.eval()
    correct = 0.0
    for real in held_images:
        netD.zero_grad()
        out_real = netD(real)
        errD_real = criterion(out_real, torch.ones(real.size(0), 1))
        errD_real.backward()  # BUG
        netG.zero_grad()
        optimizerD.step()
        correct += float((out_real > 0).float().mean())
    print(f"epoch {epoch} errD {errD.item():.4f} errG {errG.item():.4f} held-out D acc {correct / len(held_images):.3f}")

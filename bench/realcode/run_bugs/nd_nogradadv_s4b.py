# Source: synthetic: state 4 of run15miss
# Original: none (our own script; a pix2pix-style generator step whose adversarial term is computed with autograd off)
# Bug: the generator's adversarial loss is computed under torch.no_grad() and added to the L1 loss: a constant.
import torch
from torch import nn

torch.manual_seed(0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        return self.net(x)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

    def forward(self, src, out):
        return self.net(torch.cat([src, out], 1))


G, D = Generator(), Discriminator()
opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
for step in range(40):
    src, target = torch.randn(16, 16), torch.randn(16, 16)
    fake = G(src)
    opt_d.zero_grad()
    d_loss = bce(D(src, target), torch.ones(16, 1)) + bce(D(src, fake.detach()), torch.zeros(16, 1))
    d_loss.backward()
    opt_d.step()
    opt_g.zero_grad()
    with torch.no_grad():  # BUG
        adv = bce(D(src, fake), torch.ones(16, 1))
    g_loss = nn.functional.l1_loss(fake, target) * 100 + adv
    g_loss.backward()
    opt_g.step()
print("done", g_loss.item())

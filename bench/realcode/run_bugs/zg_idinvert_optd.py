# Source: https://github.com/Hsintien-Ng/idinvert_pytorch-reproduced/issues/1
# Original: Hsintien-Ng/idinvert_pytorch-reproduced training/training_loop_encoder.py
# Bug: the discriminator optimizer_D steps each iteration but is never zeroed, so D gradients pile up
# (the encoder's adversarial loss also feeds them).
import torch
import torch.nn.functional as F

torch.manual_seed(0)
G = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh())          # frozen generator
E = torch.nn.Sequential(torch.nn.Linear(32, 8))                           # encoder being trained
D = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
for p in G.parameters():
    p.requires_grad_(False)
optimizer_E = torch.optim.Adam(E.parameters(), lr=1e-4)
optimizer_D = torch.optim.Adam(D.parameters(), lr=1e-4)

for it in range(60):
    x_real = torch.randn(16, 32)
    x_rec = G(E(x_real))
    # discriminator step
    d_real = D(x_real)
    d_fake = D(x_rec.detach())
    D_loss = F.softplus(d_fake).mean() + F.softplus(-d_real).mean()
    D_loss.backward()  # BUG
    optimizer_D.step()
    # encoder step
    optimizer_E.zero_grad()
    E_loss = F.mse_loss(x_rec, x_real) + 0.1 * F.softplus(-D(x_rec)).mean()
    E_loss.backward()
    optimizer_E.step()
print("done")

# Source: https://github.com/nikhilsinghmus/image2reverb/issues/37
# Original: nikhilsinghmus/image2reverb model.py (Image2Reverb.training_step)
# Bug: in the generator step the fake spectrogram is detached before the discriminator (d(fake.detach(), f)),
# so the adversarial term G_loss1 sends no gradient to the generator; only the L1 term G_loss2 trains it.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
enc = torch.nn.Linear(24, 16)
g = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh())
d = torch.nn.Sequential(torch.nn.Linear(64 + 16, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))
opt_g = torch.optim.Adam(list(enc.parameters()) + list(g.parameters()), lr=4e-4, betas=(0.0, 0.99))
opt_d = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.0, 0.99))

for batch_idx in range(40):
    spec, image = torch.randn(8, 64), torch.randn(8, 24)
    f = enc(image)
    fake_spec = g(f)
    # generator step
    opt_g.zero_grad()
    d_fake2 = d(torch.cat([fake_spec.detach(), f], 1))  # BUG
    G_loss1 = F.mse_loss(d_fake2, torch.ones_like(d_fake2))
    G_loss2 = F.l1_loss(fake_spec, spec)
    (G_loss1 + 100 * G_loss2).backward()
    opt_g.step()
    # discriminator step
    opt_d.zero_grad()
    d_real = d(torch.cat([spec, f.detach()], 1))
    d_fake = d(torch.cat([fake_spec.detach(), f.detach()], 1))
    D_loss = 0.5 * (F.mse_loss(d_real, torch.ones_like(d_real)) + F.mse_loss(d_fake, torch.zeros_like(d_fake)))
    D_loss.backward()
    opt_d.step()
print("done")

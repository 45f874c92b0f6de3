# Source: https://github.com/rosinality/style-based-gan-pytorch/pull/50
# Original: rosinality/style-based-gan-pytorch train.py (train)
# Bug: the GAN loop reads the grad-penalty / discriminator / generator losses with .item() on every
# iteration only for the progress bar, a host-device sync per step on a GPU.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
generator = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.LeakyReLU(0.2), torch.nn.Linear(64, 64)).to(device)
discriminator = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LeakyReLU(0.2), torch.nn.Linear(64, 1)).to(device)
g_optimizer = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.0, 0.99))
d_optimizer = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.0, 0.99))
disc_loss_val = gen_loss_val = grad_loss_val = 0

for i in range(60):
    real_image = torch.randn(16, 64, device=device)
    discriminator.zero_grad()
    real_image.requires_grad = True
    real_predict = discriminator(real_image)
    real_predict = F.softplus(-real_predict).mean()
    grad_real, = torch.autograd.grad(real_predict.sum(), real_image, create_graph=True)
    grad_penalty = 10 / 2 * grad_real.pow(2).sum(1).mean()
    (real_predict + grad_penalty).backward()
    fake_image = generator(torch.randn(16, 16, device=device))
    fake_predict = F.softplus(discriminator(fake_image.detach())).mean()
    fake_predict.backward()
    d_optimizer.step()
    grad_loss_val = grad_penalty.item()  # BUG
    disc_loss_val = (real_predict + fake_predict).item()
    generator.zero_grad()
    loss = F.softplus(-discriminator(generator(torch.randn(16, 16, device=device)))).mean()
    loss.backward()
    g_optimizer.step()
    gen_loss_val = loss.item()
    state_msg = f"G: {gen_loss_val:.3f}; D: {disc_loss_val:.3f}; Grad: {grad_loss_val:.3f}"
print(state_msg)

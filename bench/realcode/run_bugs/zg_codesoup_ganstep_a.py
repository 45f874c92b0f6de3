"""code-soup GAN.step: the discriminator's gradients are never zeroed.

Source: https://github.com/Adversarial-Deep-Learning/code-soup/issues/69 ("add self.discriminator.zero_grad()"),
fixed by PR #74 (7aa48e78c7c710d521237fbcfb9512076408fe4a adds self.discriminator.zero_grad() at the top of step).
Read: code_soup/ch5/models/gan.py and mnist_gan.py at c6e4425 (the parent of the fix) in a mirror of the repository.
Theirs: Generator / Discriminator MLPs that each own an Adam optimizer, GAN.step (D on the real batch, D on the
detached fake batch, D.optimizer.step(), generator.zero_grad(), G's loss through D, G.optimizer.step()), BCELoss,
image_size 28, latent_dims 128, lr 0.02 as mnist_gan.py builds it, the epoch/batch loop calling gan.step(data).
Ours: random 14x14 images instead of 28x28 MnistDataset (a list of (image, label) batches, to keep the CPU run
short), 16 steps, docstrings trimmed.
"""
import torch
import torch.nn as nn
import torch.optim as optim


class Generator(nn.Module):
    def __init__(self, image_size: int, channels: int, latent_dims: int, lr: float):
        super().__init__()
        self.image_size = image_size
        self.channels = channels
        self.latent_dims = latent_dims
        self.main = nn.Sequential(
            nn.Linear(self.latent_dims, 256),
            nn.LeakyReLU(0.2),
            nn.Linear(256, 512),
            nn.LeakyReLU(0.2),
            nn.Linear(512, 1024),
            nn.LeakyReLU(0.2),
            nn.Linear(1024, self.image_size * self.image_size * self.channels),
            nn.Tanh(),
        )
        self.optimizer = optim.Adam(self.parameters(), lr=lr)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self.main(x)
        return output.view(-1, self.channels, self.image_size, self.image_size)


class Discriminator(nn.Module):
    def __init__(self, image_size: int, channels: int, lr: float):
        super().__init__()
        self.image_size = image_size
        self.channels = channels
        self.main = nn.Sequential(
            nn.Linear(self.image_size * self.image_size * self.channels, 1024),
            nn.LeakyReLU(0.2),
            nn.Dropout(0.3),
            nn.Linear(1024, 512),
            nn.LeakyReLU(0.2),
            nn.Dropout(0.3),
            nn.Linear(512, 256),
            nn.LeakyReLU(0.2),
            nn.Dropout(0.3),
            nn.Linear(256, 1),
            nn.Sigmoid(),
        )
        self.optimizer = optim.Adam(self.parameters(), lr=lr)

    def forward(self, x):
        x = x.view(-1, self.image_size * self.image_size * self.channels)
        return self.main(x)


class GAN:
    def __init__(self, image_size: int, channels: int, latent_dims: int, device: torch.device, lr: float):
        self.image_size = image_size
        self.channels = channels
        self.latent_dims = latent_dims
        self.device = device
        self.generator = Generator(image_size, channels, latent_dims, lr).to(device)
        self.discriminator = Discriminator(image_size, channels, lr).to(device)
        self.criterion = torch.nn.BCELoss()
        self.real_label, self.fake_label = 1.0, 0.0

    def step(self, data: torch.Tensor) -> tuple:
        real_image, _ = data
        real_image = real_image.to(self.device)
        batch_size = real_image.shape[0]
        label = torch.full((batch_size,), self.real_label, dtype=torch.float, device=self.device)
        # Forward pass real batch through D
        output = self.discriminator(real_image).view(-1)
        # Calculate loss on all-real batch
        errD_real = self.criterion(output, label)
        errD_real.backward()  # BUG
        D_x = output.mean().item()
        # Train with all-fake batch
        noise = torch.randn(batch_size, self.latent_dims, device=self.device)
        fake = self.generator(noise)
        label.fill_(self.fake_label)
        output = self.discriminator(fake.detach()).view(-1)
        errD_fake = self.criterion(output, label)
        errD_fake.backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        # Update D
        self.discriminator.optimizer.step()

        self.generator.zero_grad()
        label.fill_(self.real_label)  # fake labels are real for generator cost
        output = self.discriminator(fake).view(-1)
        errG = self.criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean().item()
        # Update G
        self.generator.optimizer.step()
        return D_x, D_G_z1, errD, D_G_z2


torch.manual_seed(0)
dataloader = [(torch.rand(64, 1, 14, 14) * 2 - 1, torch.zeros(64)) for _ in range(8)]
gan = GAN(image_size=14, channels=1, latent_dims=128, device=torch.device("cpu"), lr=0.02)
epochs = 2
for epoch in range(epochs):
    for i, data in enumerate(dataloader, 0):
        D_x, D_G_z1, errD, D_G_z2 = gan.step(data)

# Source: https://github.com/eriklindernoren/PyTorch-GAN/commit/c80d8bc1951cd8c6fb1856314f38d143a271f1f4
# Original: eriklindernoren/PyTorch-GAN implementations/acgan/acgan.py (Discriminator.aux_layer)
# Bug: the discriminator's auxiliary classifier ends in nn.Softmax() and its output is fed to
# nn.CrossEntropyLoss, which applies log_softmax again.
import torch

torch.manual_seed(0)
n_classes, latent_dim, img = 10, 16, 64


class Generator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.label_emb = torch.nn.Embedding(n_classes, latent_dim)
        self.net = torch.nn.Sequential(torch.nn.Linear(latent_dim, 64), torch.nn.LeakyReLU(0.2), torch.nn.Linear(64, img), torch.nn.Tanh())

    def forward(self, noise, labels):
        return self.net(self.label_emb(labels) * noise)


class Discriminator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(img, 64), torch.nn.LeakyReLU(0.2))
        self.adv_layer = torch.nn.Sequential(torch.nn.Linear(64, 1), torch.nn.Sigmoid())
        self.aux_layer = torch.nn.Sequential(torch.nn.Linear(64, n_classes), torch.nn.Softmax(dim=1))  # BUG

    def forward(self, x):
        out = self.body(x)
        return self.adv_layer(out), self.aux_layer(out)


generator, discriminator = Generator(), Discriminator()
adversarial_loss, auxiliary_loss = torch.nn.BCELoss(), torch.nn.CrossEntropyLoss()
optimizer_G = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
for i in range(40):
    real_imgs, labels = torch.randn(16, img), torch.randint(0, n_classes, (16,))
    valid, fake = torch.ones(16, 1), torch.zeros(16, 1)
    optimizer_G.zero_grad()
    gen_labels = torch.randint(0, n_classes, (16,))
    gen_imgs = generator(torch.randn(16, latent_dim), gen_labels)
    validity, pred_label = discriminator(gen_imgs)
    g_loss = 0.5 * (adversarial_loss(validity, valid) + auxiliary_loss(pred_label, gen_labels))
    g_loss.backward()
    optimizer_G.step()
    optimizer_D.zero_grad()
    real_pred, real_aux = discriminator(real_imgs)
    d_real_loss = (adversarial_loss(real_pred, valid) + auxiliary_loss(real_aux, labels)) / 2
    fake_pred, fake_aux = discriminator(gen_imgs.detach())
    d_fake_loss = (adversarial_loss(fake_pred, fake) + auxiliary_loss(fake_aux, gen_labels)) / 2
    d_loss = (d_real_loss + d_fake_loss) / 2
    d_loss.backward()
    optimizer_D.step()
print("done")

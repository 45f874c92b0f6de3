# Source: https://github.com/Lightning-AI/pytorch-lightning/issues/557
# Original: Lightning-AI/pytorch-lightning pl_examples/domain_templates/gan.py (GAN.training_step with
#   optimizer_i) and the 0.5 trainer's run_training_batch / optimizer_step (closure, backward, step, zero_grad)
# Bug: the trainer runs each optimizer in turn: training_step -> backward -> step -> that optimizer's
# zero_grad. The generator's loss backpropagates through the discriminator, and nothing clears the
# discriminator's gradients between that backward and the discriminator's own: its step applies the generator
# loss's gradient too (the issue: "zero_grad for discriminator is only called once all the gradients are
# accumulated, including the ones coming from the update of the generator").
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Generator(nn.Module):
    def __init__(self, latent_dim=16, img_dim=64):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(latent_dim, 128), nn.LeakyReLU(0.2), nn.Linear(128, img_dim), nn.Tanh())

    def forward(self, z):
        return self.model(z)


class Discriminator(nn.Module):
    def __init__(self, img_dim=64):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(img_dim, 128), nn.LeakyReLU(0.2), nn.Linear(128, 1), nn.Sigmoid())

    def forward(self, img):
        return self.model(img)


class GAN(nn.Module):
    def __init__(self, latent_dim=16, lr=2e-4):
        super().__init__()
        self.latent_dim = latent_dim
        self.lr = lr
        self.generator = Generator(latent_dim)
        self.discriminator = Discriminator()
        self.generated_imgs = None

    def adversarial_loss(self, y_hat, y):
        return F.binary_cross_entropy(y_hat, y)

    def training_step(self, batch, batch_nb, optimizer_i):
        imgs = batch
        if optimizer_i == 0:
            z = torch.randn(imgs.shape[0], self.latent_dim)
            self.generated_imgs = self.generator(z)
            valid = torch.ones(imgs.size(0), 1)
            return self.adversarial_loss(self.discriminator(self.generated_imgs), valid)
        if optimizer_i == 1:
            valid = torch.ones(imgs.size(0), 1)
            real_loss = self.adversarial_loss(self.discriminator(imgs), valid)
            fake = torch.zeros(imgs.size(0), 1)
            fake_loss = self.adversarial_loss(self.discriminator(self.generated_imgs.detach()), fake)
            return (real_loss + fake_loss) / 2

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=self.lr, betas=(0.5, 0.999))
        return [opt_g, opt_d]


class Trainer:
    def __init__(self, max_epochs):
        self.max_epochs = max_epochs

    def optimizer_step(self, epoch_nb, batch_nb, optimizer, optimizer_i):
        optimizer.step()
        optimizer.zero_grad()

    def run_training_batch(self, model, batch, batch_nb, epoch):
        losses = []
        for opt_idx, optimizer in enumerate(self.optimizers):
            loss = model.training_step(batch, batch_nb, opt_idx)
            loss.backward()  # BUG
            self.optimizer_step(epoch, batch_nb, optimizer, opt_idx)
            losses.append(loss.item())
        return losses

    def fit(self, model, dataloader):
        self.optimizers = model.configure_optimizers()
        for epoch in range(self.max_epochs):
            for batch_nb, batch in enumerate(dataloader):
                g_loss, d_loss = self.run_training_batch(model, batch, batch_nb, epoch)
            print(f"epoch {epoch} g_loss {g_loss:.3f} d_loss {d_loss:.3f}")


if __name__ == "__main__":
    real = [torch.tanh(torch.randn(32, 64) * 0.5 + 0.3) for _ in range(20)]
    Trainer(max_epochs=3).fit(GAN(), real)

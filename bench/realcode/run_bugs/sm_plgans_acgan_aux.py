# Source: https://github.com/nocotan/pytorch-lightning-gans/issues/9
# Original: nocotan/pytorch-lightning-gans models/acgan.py (Discriminator, ACGAN.training_step), before the fix
# Bug: the discriminator's auxiliary classifier ends in nn.Softmax, and auxiliary_loss feeds those probabilities to
# F.cross_entropy, which applies log_softmax again: the class loss is flattened and its gradients shrink (the
# maintainer agreed and removed the Softmax). The original's optimizer_idx loop (Lightning 1.x) is written with
# Lightning 2's manual optimization, one generator and one discriminator step per batch as before.
import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class Generator(nn.Module):
    def __init__(self, latent_dim, img_shape, n_classes):
        super().__init__()
        self.init_size = img_shape[1] // 4
        self.l1 = nn.Sequential(nn.Linear(latent_dim, 32 * self.init_size ** 2))
        self.label_emb = nn.Embedding(n_classes, latent_dim)
        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(32), nn.Upsample(scale_factor=2), nn.Conv2d(32, 32, 3, stride=1, padding=1),
            nn.BatchNorm2d(32, 0.8), nn.LeakyReLU(0.2, inplace=True), nn.Upsample(scale_factor=2),
            nn.Conv2d(32, 16, 3, stride=1, padding=1), nn.BatchNorm2d(16, 0.8), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(16, img_shape[0], 3, stride=1, padding=1), nn.Tanh())

    def forward(self, z, labels):
        z = torch.mul(self.label_emb(labels), z)
        out = self.l1(z)
        out = out.view(out.shape[0], 32, self.init_size, self.init_size)
        return self.conv_blocks(out)


class Discriminator(nn.Module):
    def __init__(self, img_shape, n_classes):
        super().__init__()

        def discriminator_block(in_feat, out_feat, bn=True):
            block = [nn.Conv2d(in_feat, out_feat, 3, 2, 1), nn.LeakyReLU(0.2, inplace=True), nn.Dropout2d(0.25)]
            if bn:
                block.append(nn.BatchNorm2d(out_feat, 0.8))
            return block

        self.model = nn.Sequential(*discriminator_block(img_shape[0], 16, bn=False), *discriminator_block(16, 32),
                                   *discriminator_block(32, 32))
        ds_size = img_shape[1] // 2 ** 3
        self.adv_layer = nn.Sequential(nn.Linear(32 * ds_size ** 2, 1), nn.Sigmoid())
        self.aux_layer = nn.Sequential(nn.Linear(32 * ds_size ** 2, n_classes), nn.Softmax(dim=1))  # BUG

    def forward(self, img):
        out = self.model(img)
        out = out.view(out.shape[0], -1)
        validity = self.adv_layer(out)
        label = self.aux_layer(out)
        return validity, label


class ACGAN(pl.LightningModule):
    def __init__(self, latent_dim: int = 32, n_classes: int = 4, lr: float = 0.0002, b1: float = 0.5,
                 b2: float = 0.999, batch_size: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.latent_dim, self.n_classes, self.batch_size = latent_dim, n_classes, batch_size
        img_shape = (1, 16, 16)
        self.generator = Generator(latent_dim=latent_dim, img_shape=img_shape, n_classes=n_classes)
        self.discriminator = Discriminator(img_shape=img_shape, n_classes=n_classes)

    def forward(self, z, labels):
        return self.generator(z, labels)

    def adversarial_loss(self, y_hat, y):
        return F.binary_cross_entropy(y_hat, y)

    def auxiliary_loss(self, y_hat, y):
        return F.cross_entropy(y_hat, y)

    def training_step(self, batch, batch_idx):
        imgs, labels = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(imgs.shape[0], self.latent_dim).type_as(imgs)
        gen_labels = torch.randint(0, self.n_classes, (imgs.shape[0],))

        # train generator
        valid = torch.ones(imgs.size(0), 1).type_as(imgs)
        validity, pred_label = self.discriminator(self(z, gen_labels))
        g_loss = 0.5 * self.adversarial_loss(validity, valid) + self.auxiliary_loss(pred_label, gen_labels)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()

        # train discriminator
        gen_imgs = self(z, gen_labels).detach()
        validity, pred_label = self.discriminator(imgs)
        real_loss = 0.5 * self.adversarial_loss(validity, valid) + self.auxiliary_loss(pred_label, labels)
        fake = torch.zeros(imgs.size(0), 1).type_as(imgs)
        fake_validity, fake_pred_label = self.discriminator(gen_imgs)
        fake_loss = 0.5 * self.adversarial_loss(fake_validity, fake) + self.auxiliary_loss(fake_pred_label, gen_labels)
        d_loss = (real_loss + fake_loss) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()

        d_acc = (pred_label.argmax(1) == labels).float().mean()
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss, "d_acc": d_acc}, prog_bar=False)

    def configure_optimizers(self):
        b1, b2 = self.hparams.b1, self.hparams.b2
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr, betas=(b1, b2))
        return [opt_g, opt_d], []

    def on_train_epoch_end(self):
        m = self.trainer.callback_metrics
        print(f"epoch {self.current_epoch} g_loss {m['g_loss']:.3f} d_loss {m['d_loss']:.3f} d_acc {m['d_acc']:.2f}")


def make_digits(n=512, n_classes=4):
    """16x16 images of one bar per class (vertical, horizontal, two diagonals) with noise, scaled to [-1, 1]."""
    labels = torch.randint(0, n_classes, (n,))
    imgs = torch.full((n, 1, 16, 16), -1.0)
    idx = torch.arange(16)
    for i, c in enumerate(labels.tolist()):
        if c == 0:
            imgs[i, 0, :, 7:9] = 1.0
        elif c == 1:
            imgs[i, 0, 7:9, :] = 1.0
        elif c == 2:
            imgs[i, 0, idx, idx] = 1.0
        else:
            imgs[i, 0, idx, 15 - idx] = 1.0
    return TensorDataset((imgs + 0.2 * torch.randn_like(imgs)).clamp(-1, 1), labels)


model = ACGAN()
trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, train_dataloaders=DataLoader(make_digits(), batch_size=32, shuffle=True, drop_last=True))

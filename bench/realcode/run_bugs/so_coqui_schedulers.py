# Source: https://github.com/idiap/coqui-ai-Trainer/pull/20
# Original: idiap/coqui-ai-Trainer trainer/trainer.py (Trainer.optimize / the per-optimizer scheduler steps of a GAN)
# Bug: the trainer steps every optimizer's scheduler after each training step, also the discriminator's while the
# discriminator is not trained yet (its optimizer has not stepped): its schedule runs ahead of its updates.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class GANTrainer:
    def __init__(self, generator, discriminator, start_disc_step):
        self.generator, self.discriminator = generator, discriminator
        self.optimizers = [torch.optim.AdamW(generator.parameters(), lr=2e-4),
                           torch.optim.AdamW(discriminator.parameters(), lr=2e-4)]
        self.schedulers = [torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.999) for opt in self.optimizers]
        self.start_disc_step = start_disc_step
        self.total_steps_done = 0

    def optimize_generator(self, mel, wav):
        fake = self.generator(mel)
        loss = F.l1_loss(fake, wav)
        if self.total_steps_done >= self.start_disc_step:
            loss = loss + F.mse_loss(self.discriminator(fake), torch.ones(fake.size(0), 1))
        self.optimizers[0].zero_grad()
        loss.backward()
        self.optimizers[0].step()
        return fake.detach(), loss.item()

    def optimize_discriminator(self, fake, wav):
        real_score, fake_score = self.discriminator(wav), self.discriminator(fake)
        loss = F.mse_loss(real_score, torch.ones_like(real_score)) + F.mse_loss(fake_score, torch.zeros_like(fake_score))
        self.optimizers[1].zero_grad()
        loss.backward()
        self.optimizers[1].step()

    def step_schedulers(self):
        for scheduler in self.schedulers:
            scheduler.step()  # BUG

    def train_step(self, mel, wav):
        fake, loss = self.optimize_generator(mel, wav)
        if self.total_steps_done >= self.start_disc_step:
            self.optimize_discriminator(fake, wav)
        self.step_schedulers()
        self.total_steps_done += 1
        return loss


generator = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 80))
discriminator = torch.nn.Sequential(torch.nn.Linear(80, 64), torch.nn.LeakyReLU(0.2), torch.nn.Linear(64, 1))
trainer = GANTrainer(generator, discriminator, start_disc_step=60)
for step in range(120):
    loss = trainer.train_step(torch.randn(16, 20), torch.randn(16, 80))
    if step % 30 == 0:
        print("step", step, "loss", round(loss, 4))

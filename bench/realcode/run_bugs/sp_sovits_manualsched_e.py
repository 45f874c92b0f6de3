# Source: https://github.com/voicepaw/so-vits-svc-fork/pull/291
# Original: voicepaw/so-vits-svc-fork src/so_vits_svc_fork/train.py (VitsLightning), read at 3af223e^ (b0dd0ed)
# Bug: after the rewrite to Lightning with manual optimization (automatic_optimization = False), the two
# ExponentialLR schedulers are built in __init__ and returned from configure_optimizers, but Lightning does not step
# schedulers under manual optimization and training_step never does: lr_decay has no effect and the learning rates
# stay at their initial value for the whole run. The fix steps both at the end of each epoch (trainer.is_last_batch).
# Our tiny generator/discriminator pair on synthetic frames; the VITS losses are reduced to an L1 + LSGAN pair.
import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class VitsLightning(pl.LightningModule):
    def __init__(self, learning_rate=2e-4, lr_decay=0.8, betas=(0.8, 0.99)):
        super().__init__()
        self.save_hyperparameters()
        self.net_g = nn.Sequential(nn.Linear(24, 64), nn.LeakyReLU(0.1), nn.Linear(64, 32))
        self.net_d = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.1), nn.Linear(64, 1))
        self.automatic_optimization = False
        self.optim_g = torch.optim.AdamW(self.net_g.parameters(), learning_rate, betas=betas)
        self.optim_d = torch.optim.AdamW(self.net_d.parameters(), learning_rate, betas=betas)
        self.scheduler_g = torch.optim.lr_scheduler.ExponentialLR(self.optim_g, gamma=lr_decay)
        self.scheduler_d = torch.optim.lr_scheduler.ExponentialLR(self.optim_d, gamma=lr_decay)

    def configure_optimizers(self):
        return [self.optim_g, self.optim_d], [self.scheduler_g, self.scheduler_d]  # BUG

    def training_step(self, batch, batch_idx):
        self.net_g.train()
        self.net_d.train()
        optim_g, optim_d = self.optimizers()
        c, y = batch

        # generator
        self.toggle_optimizer(optim_g)
        y_hat = self.net_g(c)
        loss_mel = F.l1_loss(y_hat, y) * 45
        loss_gen = torch.mean((1 - self.net_d(y_hat)) ** 2)
        loss_gen_all = loss_mel + loss_gen
        self.log("lr", self.optim_g.param_groups[0]["lr"])
        optim_g.zero_grad()
        self.manual_backward(loss_gen_all)
        optim_g.step()
        self.untoggle_optimizer(optim_g)

        # discriminator
        self.toggle_optimizer(optim_d)
        d_real = self.net_d(y)
        d_fake = self.net_d(y_hat.detach())
        loss_disc_all = torch.mean((1 - d_real) ** 2) + torch.mean(d_fake**2)
        optim_d.zero_grad()
        self.manual_backward(loss_disc_all)
        optim_d.step()
        self.untoggle_optimizer(optim_d)


features = torch.randn(512, 24)
frames = torch.tanh(features @ torch.randn(24, 32))
loader = DataLoader(TensorDataset(features, frames), batch_size=32, shuffle=True)
model = VitsLightning()
trainer = pl.Trainer(max_epochs=6, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, loader)
print("lr after", trainer.current_epoch, "epochs:", model.optim_g.param_groups[0]["lr"], model.optim_d.param_groups[0]["lr"])

# Source: https://github.com/galilai-group/stable-worldmodel/issues/280
# Original: galilai-group/stable-worldmodel scripts/train/lewm.py (the optimizer/scheduler config: warm-up and
# cosine horizons computed as max_epochs * len(train), with 'interval': 'epoch')
# Bug: the warm-up/cosine schedule is sized in optimizer steps but Lightning is told to step it once per epoch, so
# over the whole run it advances max_epochs of its total_steps: the learning rate never decays from its peak.
import math

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def warmup_cosine(warmup_steps, max_steps):
    def factor(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class WorldModel(pl.LightningModule):
    def __init__(self, total_steps):
        super().__init__()
        self.total_steps = total_steps
        self.encoder = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        self.predictor = torch.nn.Sequential(torch.nn.Linear(16 + 2, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))

    def training_step(self, batch, batch_idx):
        obs, action, next_obs = batch
        z_next = self.predictor(torch.cat([self.encoder(obs), action], dim=-1))
        loss = F.mse_loss(z_next, self.encoder(next_obs).detach())
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=1e-3)
        warmup_steps = max(1, int(0.01 * self.total_steps))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(warmup_steps, self.total_steps))
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}  # BUG


obs = torch.randn(640, 12)
dataset = torch.utils.data.TensorDataset(obs, torch.randn(640, 2), obs.roll(1, 0) + 0.1 * torch.randn(640, 12))
train = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True)
max_epochs = 5
model = WorldModel(total_steps=max_epochs * len(train))
trainer = pl.Trainer(max_epochs=max_epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, train)
print("final lr", trainer.optimizers[0].param_groups[0]["lr"])

# Source: https://github.com/ace-step/ACE-Step/pull/198
# Original: ace-step/ACE-Step trainer.py (Pipeline.configure_optimizers, Pipeline.training_step), at 3d6fe06
# Bug: configure_optimizers returns a LambdaLR whose lambda counts optimizer steps (linear warmup over warmup_steps,
# then linear decay to max_steps) as a bare scheduler, so Lightning steps it once per epoch: the whole first epoch
# trains at LR 0 and the warmup would take warmup_steps epochs (fixed: {"scheduler": ..., "interval": "step"}).
import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class Pipeline(pl.LightningModule):
    def __init__(self, learning_rate: float = 1e-3, weight_decay: float = 1e-2, max_steps: int = 400,
                 warmup_steps: int = 40):
        super().__init__()
        self.save_hyperparameters()
        self.transformers = nn.Sequential(nn.Linear(33, 128), nn.SiLU(), nn.Linear(128, 128), nn.SiLU(),
                                          nn.Linear(128, 32))

    def training_step(self, batch, batch_idx):
        (target_latents,) = batch
        noise = torch.randn_like(target_latents)
        sigmas = torch.rand(target_latents.shape[0], 1)
        noisy = sigmas * noise + (1.0 - sigmas) * target_latents  # flow matching
        model_pred = self.transformers(torch.cat([noisy, sigmas], dim=1))
        loss = F.mse_loss(model_pred, noise - target_latents)
        self.log("train/denoising_loss", loss, prog_bar=False)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def configure_optimizers(self):
        trainable_params = [p for name, p in self.transformers.named_parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params=[{"params": trainable_params}], lr=self.hparams.learning_rate,
                                      weight_decay=self.hparams.weight_decay, betas=(0.8, 0.9))
        max_steps = self.hparams.max_steps
        warmup_steps = self.hparams.warmup_steps

        def lr_lambda(current_step):
            if current_step < warmup_steps:
                return float(current_step) / float(max(1, warmup_steps))
            progress = float(current_step - warmup_steps) / float(max(1, max_steps - warmup_steps))
            return max(0.0, 1.0 - progress)

        lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda, last_epoch=-1)
        return [optimizer], lr_scheduler  # BUG

    def on_train_epoch_end(self):
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        print(f"epoch {self.current_epoch} lr {lr:.2e} loss {self.trainer.callback_metrics['train/denoising_loss']:.4f}")


def train_dataloader():
    latents = torch.randn(640, 32) * 0.5 + torch.linspace(-1, 1, 32)
    return DataLoader(TensorDataset(latents), batch_size=32, shuffle=True)


model = Pipeline()
trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=4, max_steps=400, log_every_n_steps=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, train_dataloaders=train_dataloader())

# Variant of tr_lerobot_evalpolicy (same bug, another shape; written for torchdoctor's dev set, no public source)
# Bug: a Lightning callback draws samples from the module every 10 training batches: it calls pl_module.eval()
# and never restores train mode. Lightning switches the module to train mode when an epoch starts, so the rest
# of each epoch trains with dropout off.
import lightning.pytorch as pl
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class SampleCallback(pl.Callback):
    def __init__(self, every=10):
        self.every = every
        self.z = torch.randn(4, 8)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx % self.every == 0:
            pl_module.eval()  # BUG
            with torch.no_grad():
                sample = pl_module(self.z)
            print(f"step {trainer.global_step} sample mean {sample.mean():.4f}")


x = torch.randn(640, 8)
y = x.sum(1, keepdim=True)
loader = DataLoader(TensorDataset(x, y), batch_size=16)
trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[SampleCallback()])
trainer.fit(Regressor(), loader)

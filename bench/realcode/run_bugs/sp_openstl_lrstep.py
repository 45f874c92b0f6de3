# Source: https://github.com/chengtan9907/OpenSTL/issues/113
# Original: chengtan9907/OpenSTL openstl/methods/base_method.py (Base_method.lr_scheduler_step, configure_optimizers)
# Bug: the LightningModule overrides lr_scheduler_step with scheduler.step(epoch=self.current_epoch); the
# OneCycleLR is built for epochs * steps_per_epoch and Lightning calls the hook every step ("interval": "step"),
# so each call pins the schedule at position <epoch>: the learning rate never leaves its warm-up start.
import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class SimVP(L.LightningModule):
    def __init__(self, lr=1e-3, epochs=4, steps_per_epoch=16):
        super().__init__()
        self.save_hyperparameters()
        self.model = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1), torch.nn.GELU(),
                                         torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.GELU(),
                                         torch.nn.Conv2d(16, 4, 3, padding=1))

    def forward(self, batch_x):
        return self.model(batch_x)

    def training_step(self, batch, batch_idx):
        batch_x, batch_y = batch
        loss = F.mse_loss(self(batch_x), batch_y)
        self.log("train_loss", loss, on_step=True, prog_bar=False)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.hparams.lr,
                                                        epochs=self.hparams.epochs,
                                                        steps_per_epoch=self.hparams.steps_per_epoch)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def lr_scheduler_step(self, scheduler, metric):
        scheduler.step(epoch=self.current_epoch)  # BUG


frames = torch.randn(256, 8, 16, 16)
loader = DataLoader(TensorDataset(frames[:, :4], frames[:, 4:]), batch_size=16, shuffle=True)
model = SimVP(epochs=4, steps_per_epoch=len(loader))
trainer = L.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, loader)
print("final lr", trainer.optimizers[0].param_groups[0]["lr"])

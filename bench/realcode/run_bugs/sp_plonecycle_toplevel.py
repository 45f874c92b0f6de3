# Source: https://github.com/Lightning-AI/pytorch-lightning/issues/6948
# Original: the LightningModule.configure_optimizers quoted in the issue (OneCycleLR sized epochs x
# steps_per_epoch, with 'interval': 'step' written next to the optimizer instead of inside the scheduler dict)
# Bug: Lightning reads 'interval' only inside the lr_scheduler dict; at the top level it is dropped (2.x warns
# "unsupported keys"), so the OneCycleLR sized in batches is stepped once per epoch and never leaves its warm-up.
import lightning.pytorch as pl
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Regressor(pl.LightningModule):
    def __init__(self, loaders_dict, max_lr=1e-2, epochs=6):
        super().__init__()
        self.loaders_dict = loaders_dict
        self.max_lr = max_lr
        self.epochs = epochs
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def train_dataloader(self):
        return self.loaders_dict["train"]

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.max_lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, self.max_lr, epochs=self.epochs,
                                                        steps_per_epoch=len(self.loaders_dict["train"]))
        return {"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "train_loss",
                "interval": "step"}  # BUG


x = torch.randn(512, 10)
y = x[:, :1] * 2 + 0.1 * torch.randn(512, 1)
loaders = {"train": torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)}
model = Regressor(loaders)
trainer = pl.Trainer(max_epochs=model.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model)
print("final lr", trainer.optimizers[0].param_groups[0]["lr"], "peak", model.max_lr)

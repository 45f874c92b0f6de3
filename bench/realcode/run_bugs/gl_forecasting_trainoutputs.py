# Source: https://github.com/sktime/pytorch-forecasting/pull/1924 (issues #1369, #1461)
# Original: sktime/pytorch-forecasting pytorch_forecasting/models/base/_base_model.py (BaseModel.training_step)
# Bug: the LightningModule appends each step's log dict, whose loss still holds its graph, to
# self.training_step_outputs for the epoch-end hook: every batch's graph is kept alive until the epoch ends.
import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class BaseModel(pl.LightningModule):
    def __init__(self, n_features, horizon):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(n_features, 64), torch.nn.ReLU(), torch.nn.Linear(64, horizon))
        self.training_step_outputs = []

    def step(self, x, y):
        prediction = self.net(x)
        loss = F.smooth_l1_loss(prediction, y)
        return {"loss": loss, "n_samples": x.size(0)}, prediction

    def training_step(self, batch, batch_idx):
        x, y = batch
        log, out = self.step(x, y)
        self.training_step_outputs.append(log)  # BUG
        return log

    def on_train_epoch_end(self):
        losses = torch.stack([o["loss"] for o in self.training_step_outputs])
        self.log("train_loss_epoch", losses.mean().item())
        self.training_step_outputs.clear()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


x = torch.randn(4096, 48)
y = x[:, :12].cumsum(1) * 0.1
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = BaseModel(48, 12)
trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, loader)
print("done", float(trainer.callback_metrics["train_loss_epoch"]))

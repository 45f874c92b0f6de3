# Source: https://github.com/bytedance/music_source_separation/issues/20
# Original: bytedance/music_source_separation music_source_separation/callbacks/callback_save_checkpoints.py
#   (CallbackCheckpoint, a Lightning callback that writes the step checkpoints) and models/lightning_modules.py
# Bug: the step checkpoints are written by a callback as {'step', 'model'} only: the Adam moments and the
# warm-up LambdaLR the LightningModule configures are never saved, so training cannot be resumed from them
# (the issue: "checkpoint contains only the model").
import logging
import os
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class CallbackCheckpoint(pl.Callback):
    def __init__(self, model: nn.Module, checkpoints_dir: str, save_step_frequency: int):
        self.model = model
        self.checkpoints_dir = checkpoints_dir
        self.save_step_frequency = save_step_frequency
        os.makedirs(self.checkpoints_dir, exist_ok=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        global_step = trainer.global_step
        if global_step % self.save_step_frequency == 0:
            checkpoint_path = os.path.join(self.checkpoints_dir, f"step={global_step}.pth")
            checkpoint = {"step": global_step, "model": self.model.state_dict()}
            torch.save(checkpoint, checkpoint_path)  # BUG
            logging.info(f"Save checkpoint to {checkpoint_path}")


class Separator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))

    def forward(self, mixture):
        return torch.sigmoid(self.net(mixture)) * mixture


class LitSourceSeparation(pl.LightningModule):
    def __init__(self, model, learning_rate=1e-3, warm_up_steps=20):
        super().__init__()
        self.model = model
        self.learning_rate = learning_rate
        self.warm_up_steps = warm_up_steps

    def training_step(self, batch, batch_idx):
        mixture, target = batch
        loss = F.l1_loss(self.model(mixture), target)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.model.parameters(), lr=self.learning_rate, betas=(0.9, 0.999),
                                     amsgrad=True)
        warm_up = self.warm_up_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warm_up))
        return [optimizer], [{"scheduler": scheduler, "interval": "step", "frequency": 1}]


def main():
    workspace = tempfile.mkdtemp()
    mixture = torch.rand(512, 64)
    target = mixture * (torch.rand(512, 64) > 0.5).float()
    loader = DataLoader(TensorDataset(mixture, target), batch_size=16, shuffle=True)
    model = Separator()
    pl_model = LitSourceSeparation(model)
    callback = CallbackCheckpoint(model, os.path.join(workspace, "checkpoints"), save_step_frequency=16)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(pl_model, loader)
    print("checkpoints", sorted(os.listdir(os.path.join(workspace, "checkpoints"))))


if __name__ == "__main__":
    main()

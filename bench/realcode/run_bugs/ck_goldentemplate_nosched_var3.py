# Source: https://github.com/amjltc295/pytorch-golden-template/issues/50 (variant of ck_goldentemplate_nosched_b: the
#   checkpoint leaves out training state, here a Lightning 2.x module that strips it in on_save_checkpoint to keep
#   the files small; the code is ours)
# Bug: Lightning's ModelCheckpoint writes the optimizer's and the scheduler's state into every .ckpt, but the module's
# on_save_checkpoint hook deletes both lists; `trainer.fit(ckpt_path=...)` would then find no optimizer state to
# restore, and a resumed run restarts Adam and the cosine schedule.
import tempfile

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.body(x).squeeze(-1), y)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=3e-3)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)}

    def on_save_checkpoint(self, checkpoint):
        for key in ("optimizer_states", "lr_schedulers"):
            checkpoint.pop(key, None)  # BUG


torch.manual_seed(0)
x = torch.randn(96, 12)
loader = DataLoader(TensorDataset(x, x[:, :4].sum(1)), batch_size=16)
root = tempfile.mkdtemp()
trainer = L.Trainer(max_epochs=4, default_root_dir=root, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, accelerator="cpu",
                    callbacks=[ModelCheckpoint(dirpath=root, every_n_epochs=1, save_top_k=-1)])
trainer.fit(Regressor(), loader)
saved = torch.load(trainer.checkpoint_callback.best_model_path or f"{root}/epoch=3-step=24.ckpt", weights_only=False)
print(f"checkpoint keys: {sorted(saved)}")

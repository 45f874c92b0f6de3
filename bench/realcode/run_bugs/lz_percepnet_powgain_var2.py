# Source: https://github.com/jzi040941/PercepNet/issues/37 (variant of lz_percepnet_powgain, written by run13c)
# Original: none (a variant): the same family in another shape, a Lightning 2.x module whose training_step adds a
# soft-Dice term computed by a metric helper function; the segmentation data are synthetic
# Bug: the helper takes the log of the soft Dice ratio; for a batch with no foreground pixels in the target and a
# prediction that has learned to say "background", the ratio's numerator is exactly 0 (a ReLU-clipped score), log(0)
# is -inf and the loss is -inf then NaN; the first non-finite value is made by the log inside the helper.
import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader


def log_dice(pred, target, dims=(1, 2, 3)):
    inter = (pred * target).sum(dims)
    union = pred.sum(dims) + target.sum(dims)
    return torch.log(2 * inter / union.clamp(min=1e-6))  # BUG


class SegModule(L.LightningModule):
    def __init__(self, lr=5e-3):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        prob = F.relu(torch.tanh(logits))
        bce = F.binary_cross_entropy_with_logits(logits, y)
        dice_term = -log_dice(prob, y).mean()
        loss = bce + 0.5 * dice_term
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def make_batches(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randn(4, 1, 16, 16, generator=g)
        y = (x > 0.8).float()
        if i % 5 == 4:
            x, y = x - 3.0, torch.zeros_like(y)
        out.append((x, y))
    return out


torch.manual_seed(0)
trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
model = SegModule()
trainer.fit(model, train_dataloaders=DataLoader(make_batches(20, 0), batch_size=None))
print("weights finite:", all(p.isfinite().all().item() for p in model.parameters()))

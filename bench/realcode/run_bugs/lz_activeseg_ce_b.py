# Source: https://github.com/HealthML/active-segmentation/pull/78 (closes issue #77)
# Original: HealthML/active-segmentation src/functional/losses.py (CrossEntropyLoss) and src/models/pytorch_model.py
# (PytorchModel.training_step); from the PR text and a later tree (06c662e), which wraps torch's BCELoss instead
# Bug: the single-class cross-entropy is computed by hand as -(t * log(p) + (1 - t) * log(1 - p)) on sigmoid
# outputs; once the model is confident, sigmoid saturates to exactly 1.0 (or 0.0) on some pixels and the unused term
# becomes 0 * log(0) = 0 * -inf = NaN: the loss turns NaN mid-training and so do the weights.
from typing import Literal

import lightning as L
import torch


class SegmentationLoss(torch.nn.Module):
    def __init__(self, reduction: Literal["mean", "sum", "none"] = "mean", epsilon: float = 1e-5):
        super().__init__()
        self.reduction = reduction
        self.epsilon = epsilon

    def _reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        if self.reduction == "mean":
            return loss.mean()
        if self.reduction == "sum":
            return loss.sum()
        return loss


class CrossEntropyLoss(SegmentationLoss):
    def __init__(self, multi_label: bool = False, reduction: Literal["mean", "sum", "none"] = "mean"):
        super().__init__(reduction=reduction)
        self.multi_label = multi_label

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert prediction.shape == target.shape
        target = target.float()
        loss = -(target * torch.log(prediction) + (1 - target) * torch.log(1 - prediction))  # BUG
        axis_to_reduce = tuple(range(1, loss.dim()))
        return self._reduce_loss(loss.mean(dim=axis_to_reduce))


class UNetLite(torch.nn.Module):
    def __init__(self, channels=8):
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Conv2d(1, channels, 3, padding=1), torch.nn.ReLU(),
                                       torch.nn.Conv2d(channels, channels, 3, padding=1), torch.nn.ReLU())
        self.head = torch.nn.Conv2d(channels, 1, 1)

    def forward(self, x):
        return torch.sigmoid(self.head(self.enc(x)))


class PytorchModel(L.LightningModule):
    def __init__(self, learning_rate: float = 0.01):
        super().__init__()
        self.model = UNetLite()
        self.loss_module = CrossEntropyLoss(multi_label=False)
        self.learning_rate = learning_rate

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)

    def training_step(self, batch, batch_idx):
        x, y = batch
        probabilities = self.model(x)
        loss = self.loss_module(probabilities, y)
        self.log("train/loss", loss)
        return loss


def make_loader(n=192, size=24):
    # synthetic slices: a bright blob on a dark background, the blob is the foreground label
    images = torch.randn(n, 1, size, size) * 0.1
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    centres = torch.randint(6, size - 6, (n, 2))
    masks = ((yy[None] - centres[:, 0, None, None]) ** 2 + (xx[None] - centres[:, 1, None, None]) ** 2) < 16
    images[:, 0][masks] += 3.0
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, masks[:, None].float()), batch_size=16,
                                       shuffle=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = PytorchModel()
    trainer = L.Trainer(max_epochs=8, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, make_loader())
    print("head finite:", bool(torch.isfinite(model.model.head.weight).all()))

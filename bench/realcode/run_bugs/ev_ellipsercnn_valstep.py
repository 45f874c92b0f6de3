# Source: https://github.com/wdoppenberg/ellipse-rcnn/issues/13
# Original: wdoppenberg/ellipse-rcnn ellipse_rcnn/pl/model.py (EllipseRCNNLightning.validation_step)
# Bug: the detector (like torchvision's GeneralizedRCNN) returns its losses only in training mode, so
# validation_step switches the module back to train mode before its forward: every validation batch
# runs with dropout on and batch norm normalising by, and updating its running statistics with, the
# validation data (the maintainer: "a bit strange", inherited from GeneralizedRCNN).
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class TinyDetector(torch.nn.Module):
    """Returns a dict of losses in training mode and predictions in eval mode (torchvision's convention)."""

    def __init__(self, num_classes=3):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                            torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Dropout(0.2))
        self.cls_head = torch.nn.Linear(128, num_classes)
        self.box_head = torch.nn.Linear(128, 5)  # an ellipse: centre, axes, angle

    def forward(self, images, targets=None):
        features = self.backbone(images)
        logits, ellipses = self.cls_head(features), self.box_head(features)
        if self.training:
            return {"loss_classifier": F.cross_entropy(logits, targets["labels"]),
                    "loss_ellipse": F.smooth_l1_loss(ellipses, targets["ellipses"])}
        return {"labels": logits.argmax(1), "ellipses": ellipses}


class EllipseRCNNLightning(TinyDetector, pl.LightningModule):
    def __init__(self, lr=1e-3, weight_decay=1e-4, **model_kwargs):
        super().__init__(**model_kwargs)
        self.save_hyperparameters("lr", "weight_decay")
        self.lr, self.weight_decay = lr, weight_decay

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay, amsgrad=True)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=2, min_lr=1e-6)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss_total"}}

    def training_step(self, batch, batch_idx=0):
        images, labels, ellipses = batch
        loss_dict = self(images, {"labels": labels, "ellipses": ellipses})
        loss = sum(loss_dict.values())
        self.log("train/loss_total", loss, prog_bar=True, on_step=True)
        return loss

    def validation_step(self, batch, batch_idx=0):
        self.train(True)  # BUG
        images, labels, ellipses = batch
        loss_dict = self(images, {"labels": labels, "ellipses": ellipses})
        val_loss = sum(loss_dict.values())
        self.log("val/loss_total", val_loss, prog_bar=True, on_step=False, on_epoch=True)
        return val_loss


def split(n, seed):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 16, 16, generator=g)
    labels = torch.randint(0, 3, (n,), generator=g)
    images[:, :, :4, :4] += labels.view(-1, 1, 1, 1).float()
    return TensorDataset(images, labels, torch.randn(n, 5, generator=g))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = EllipseRCNNLightning()
    trainer = pl.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(split(192, 0), batch_size=16, shuffle=True), DataLoader(split(64, 1), batch_size=16))
    print("bn running mean after fit:", model.backbone[1].running_mean[:3].tolist())

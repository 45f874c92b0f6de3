"""Source: https://github.com/vturrisi/solo-learn/commit/a7ac404e8388c955dca686de352e1aef7820bc3a
("fix num steps scheduler when interval is not step", PR #280). Read: solo/methods/base.py at the fix's parent
(a7ac404^), BaseMethod.__init__, num_training_steps and configure_optimizers.

Bug: configure_optimizers always gives LinearWarmupCosineAnnealingLR its warmup and horizon in optimizer steps
(`warmup_epochs * num_training_steps`, `max_epochs * num_training_steps`), but hands it to Lightning with
`"interval": self.scheduler_interval`. With scheduler_interval="epoch" the scheduler is stepped once per epoch, so
the run ends deep inside the warmup: the learning rate never reaches its base value and the cosine never starts.
The fix divides nothing: it passes epochs when the interval is "epoch".

Theirs: the configure_optimizers body (optimizer picked from _OPTIMIZERS, the scheduler dict with interval and
frequency, the `[optimizer], [scheduler]` return), num_training_steps's formula (dataset size * limit_train_batches
// (batch size * accumulation * devices * nodes)), the hyper-parameter names and defaults (warmup_start_lr 3e-5,
warmup_epochs 10 here 2). Ours: a small MLP classifier instead of the SSL backbone and method, random tensors
instead of the image folder, compute_dataset_size replaced by len(dataset), static_lr groups left out, and a
LinearWarmupCosineAnnealingLR written here from pl_bolts' closed form (pl_bolts is not installed).
"""
import math
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

warnings.filterwarnings("ignore")
torch.manual_seed(0)


class LinearWarmupCosineAnnealingLR(LRScheduler):
    def __init__(self, optimizer, warmup_epochs, max_epochs, warmup_start_lr=0.0, eta_min=0.0, last_epoch=-1):
        self.warmup_epochs = warmup_epochs
        self.max_epochs = max_epochs
        self.warmup_start_lr = warmup_start_lr
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        e = self.last_epoch
        if e < self.warmup_epochs:
            return [self.warmup_start_lr + e * (b - self.warmup_start_lr) / max(1, self.warmup_epochs - 1)
                    for b in self.base_lrs]
        return [self.eta_min + 0.5 * (b - self.eta_min)
                * (1 + math.cos(math.pi * (e - self.warmup_epochs) / (self.max_epochs - self.warmup_epochs)))
                for b in self.base_lrs]


class BaseMethod(pl.LightningModule):
    _OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}

    def __init__(self, dataset, batch_size=32, optimizer="sgd", lr=0.3, weight_decay=1e-4, max_epochs=6,
                 scheduler="warmup_cosine", min_lr=0.0, warmup_start_lr=0.00003, warmup_epochs=2,
                 scheduler_interval="epoch", extra_optimizer_args=None):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.classifier = nn.Linear(64, 10)
        self.dataset = dataset
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.lr = lr
        self.weight_decay = weight_decay
        self.max_epochs = max_epochs
        self.scheduler = scheduler
        self.min_lr = min_lr
        self.warmup_start_lr = warmup_start_lr
        self.warmup_epochs = warmup_epochs
        assert scheduler_interval in ["step", "epoch"]
        self.scheduler_interval = scheduler_interval
        self.extra_optimizer_args = extra_optimizer_args or {"momentum": 0.9}
        self._num_training_steps = None

    @property
    def learnable_params(self):
        return [{"name": "backbone", "params": self.backbone.parameters()},
                {"name": "classifier", "params": self.classifier.parameters(), "weight_decay": 0}]

    @property
    def num_training_steps(self) -> int:
        if self._num_training_steps is None:
            dataset_size = len(self.dataset)
            dataset_size = self.trainer.limit_train_batches * dataset_size
            num_devices = self.trainer.num_devices
            num_nodes = self.trainer.num_nodes
            effective_batch_size = (
                self.batch_size * self.trainer.accumulate_grad_batches * num_devices * num_nodes
            )
            self._num_training_steps = dataset_size // effective_batch_size
        return self._num_training_steps

    def configure_optimizers(self):
        assert self.optimizer in self._OPTIMIZERS
        optimizer = self._OPTIMIZERS[self.optimizer]
        optimizer = optimizer(
            self.learnable_params,
            lr=self.lr,
            weight_decay=self.weight_decay,
            **self.extra_optimizer_args,
        )
        if self.scheduler.lower() == "none":
            return optimizer
        if self.scheduler == "warmup_cosine":
            scheduler = {
                "scheduler": LinearWarmupCosineAnnealingLR(
                    optimizer,
                    warmup_epochs=self.warmup_epochs * self.num_training_steps,  # BUG
                    max_epochs=self.max_epochs * self.num_training_steps,
                    warmup_start_lr=self.warmup_start_lr if self.warmup_epochs > 0 else self.lr,
                    eta_min=self.min_lr,
                ),
                "interval": self.scheduler_interval,
                "frequency": 1,
            }
        else:
            raise ValueError(f"{self.scheduler} not in (warmup_cosine, cosine, step)")
        return [optimizer], [scheduler]

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.classifier(self.backbone(x)), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)


x = torch.randn(640, 32)
y = (x[:, :10].argmax(1) + (x[:, 10] > 0).long()) % 10
model = BaseMethod(torch.utils.data.TensorDataset(x, y))
trainer = pl.Trainer(max_epochs=model.max_epochs, accelerator="cpu", devices=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model)

"""VALL-E trainer whose Eden scheduler is stepped per batch but never told the epoch.

Source: https://github.com/lifeiteng/vall-e/commit/709220d5d48598b76c503162f1015d1bbae814d5
("Fix Eden scheduler epoch"), read at its parent c6c888a6fd96b2ab358342bd287f1bb3c0b2e718
(valle/bin/trainer.py: train_one_epoch, run; valle/modules/optim.py: LRScheduler, Eden;
valle/modules/scheduler.py: get_scheduler).

Theirs: LRScheduler and Eden (icefall's batch-and-epoch scheduler) as in optim.py,
get_scheduler's Eden branch (lr_batches 5000, lr_epochs 4, warmup_batches = --warmup-steps 200),
train_one_epoch's step logic (GradScaler, accumulate_grad_steps, unscale + clip for a non-ScaledAdam
optimizer, `scheduler.step_batch(params.batch_idx_train)` after each optimizer step) and run's
epoch loop (params.cur_epoch = epoch, then train_one_epoch). Ours: a small token model and random
text/audio-token batches instead of the VALL-E model and lhotse data; `--optimizer-name AdamW`
(one of their choices; the default ScaledAdam is not reproduced) with base_lr 1e-3; 8 epochs of
6 batches; no validation, checkpoints, tensorboard or model averaging; CPU, fp32; typing
modernised by ruff (lint).

The bug: Eden's lr is base_lr * batch_factor * epoch_factor, where the epoch factor only moves
when step_epoch() is called. run() never calls it, so scheduler.epoch stays 0 and the epoch decay
(lr_epochs=4: x0.84 at epoch 4, x0.67 at epoch 8, x0.54 at epoch 12, ...) never happens; with
lr_batches=5000 the batch factor barely moves either, so the learning rate only follows the
warm-up upwards. The fix calls scheduler.step_epoch(epoch) at the top of each epoch.
"""
import logging

import torch
from torch import nn
from torch.optim import Optimizer


class AttributeDict(dict):
    def __getattr__(self, key):
        return self[key]

    def __setattr__(self, key, value):
        self[key] = value


class LRScheduler:
    """
    Base-class for learning rate schedulers where the learning-rate depends on both the
    batch and the epoch.
    """

    def __init__(self, optimizer: Optimizer, verbose: bool = False):
        # Attach optimizer
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"{type(optimizer).__name__} is not an Optimizer"
            )
        self.optimizer = optimizer
        self.verbose = verbose

        for group in optimizer.param_groups:
            group.setdefault("base_lr", group["lr"])

        self.base_lrs = [group["base_lr"] for group in optimizer.param_groups]

        self.epoch = 0
        self.batch = 0

    def state_dict(self):
        return {
            "base_lrs": self.base_lrs,
            "epoch": self.epoch,
            "batch": self.batch,
        }

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)

    def get_last_lr(self) -> list[float]:
        """Return last computed learning rate by current scheduler.  Will be a list of float."""
        return self._last_lr

    def get_lr(self):
        raise NotImplementedError

    def step_batch(self, batch: int | None = None) -> None:
        # Step the batch index, or just set it.  If `batch` is specified, it
        # must be the batch index from the start of training, i.e. summed over
        # all epochs.
        if batch is not None:
            self.batch = batch
        else:
            self.batch = self.batch + 1
        self._set_lrs()

    def step_epoch(self, epoch: int | None = None):
        # Step the epoch index, or just set it.  If you provide the 'epoch' arg,
        # you should call this at the start of the epoch; if you don't provide the 'epoch'
        # arg, you should call it at the end of the epoch.
        if epoch is not None:
            self.epoch = epoch
        else:
            self.epoch = self.epoch + 1
        self._set_lrs()

    def _set_lrs(self):
        values = self.get_lr()
        assert len(values) == len(self.optimizer.param_groups)

        for i, data in enumerate(zip(self.optimizer.param_groups, values)):
            param_group, lr = data
            param_group["lr"] = lr
            self.print_lr(self.verbose, i, lr)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def print_lr(self, is_verbose, group, lr):
        """Display the current learning rate."""
        if is_verbose:
            logging.info(
                f"Epoch={self.epoch}, batch={self.batch}: adjusting learning rate"
                f" of group {group} to {lr:.4e}."
            )


class Eden(LRScheduler):
    """
    Eden scheduler.
    The basic formula (before warmup) is:
      lr = base_lr * (((batch**2 + lr_batches**2) / lr_batches**2) ** -0.25 *
                     (((epoch**2 + lr_epochs**2) / lr_epochs**2) ** -0.25)) * warmup
    where `warmup` increases from linearly 0.5 to 1 over `warmup_batches` batches
    and then stays constant at 1.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        lr_batches: int | float,
        lr_epochs: int | float,
        warmup_batches: int | float = 500.0,
        verbose: bool = False,
    ):
        super().__init__(optimizer, verbose)
        self.lr_batches = lr_batches
        self.lr_epochs = lr_epochs
        self.warmup_batches = warmup_batches

    def get_lr(self):
        factor = (
            (self.batch ** 2 + self.lr_batches ** 2) / self.lr_batches ** 2
        ) ** -0.25 * (
            ((self.epoch ** 2 + self.lr_epochs ** 2) / self.lr_epochs ** 2)
            ** -0.25
        )
        warmup_factor = (
            1.0
            if self.batch >= self.warmup_batches
            else 0.5 + 0.5 * (self.batch / self.warmup_batches)
        )

        return [x * factor * warmup_factor for x in self.base_lrs]


def get_scheduler(params, optimizer):
    if params.scheduler_name.lower() == "eden":
        scheduler = Eden(optimizer, 5000, 4, warmup_batches=params.warmup_steps)
    else:
        raise NotImplementedError(f"{params.scheduler_name}")
    return scheduler


class TokenModel(nn.Module):
    """Ours: a small text-to-audio-token model standing in for VALL-E."""

    def __init__(self, num_text_tokens=64, num_audio_tokens=128, dim=32):
        super().__init__()
        self.text_embedding = nn.Embedding(num_text_tokens, dim)
        self.encoder = nn.GRU(dim, dim, batch_first=True)
        self.predict = nn.Linear(dim, num_audio_tokens)

    def forward(self, x, y):
        h, _ = self.encoder(self.text_embedding(x))
        logits = self.predict(h)
        loss = nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="sum")
        return logits, loss


def compute_loss(params, model, batch, is_training):
    device = next(model.parameters()).device
    text_tokens = batch["text_tokens"].to(device)
    audio_tokens = batch["audio_tokens"].to(device)
    with torch.set_grad_enabled(is_training):
        predicts, loss = model(text_tokens, audio_tokens)
    info = {"loss": loss.detach().cpu().item(), "frames": audio_tokens.numel()}
    return predicts, loss, info


def train_one_epoch(params, model, optimizer, scheduler, train_dl, scaler):
    model.train()
    iter_dl = iter(train_dl)

    batch_idx = 0
    while True:
        try:
            batch = next(iter_dl)
        except StopIteration:
            logging.info("Reaches end of dataloader.")
            if params.batch_idx_train % params.accumulate_grad_steps:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
            break

        batch_idx += 1

        params.batch_idx_train += 1

        _, loss, loss_info = compute_loss(
            params=params,
            model=model,
            batch=batch,
            is_training=True,
        )

        scaler.scale(loss).backward()
        if params.batch_idx_train >= params.accumulate_grad_steps:
            if params.batch_idx_train % params.accumulate_grad_steps == 0:
                if params.optimizer_name not in ["ScaledAdam", "Eve"]:
                    # Unscales the gradients of optimizer's assigned params in-place
                    scaler.unscale_(optimizer)
                    # Since the gradients of optimizer's assigned params are unscaled, clips as usual:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()

                for k in range(params.accumulate_grad_steps):
                    if isinstance(scheduler, Eden):
                        scheduler.step_batch(params.batch_idx_train)
                    else:
                        scheduler.step()

    cur_lr = scheduler.get_last_lr()[0]
    print(f"Epoch {params.cur_epoch}, batch {batch_idx}, loss {loss_info['loss'] / loss_info['frames']:.4f}, "
          f"lr: {cur_lr:.2e}")


def run(params, train_dl):
    torch.manual_seed(params.seed)
    model = TokenModel()
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=params.base_lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=1e-2,
    )
    scheduler = get_scheduler(params, optimizer)
    optimizer.zero_grad()

    scaler = torch.amp.GradScaler("cpu", enabled=(params.dtype in ["fp16", "float16"]), init_scale=1.0)

    for epoch in range(params.start_epoch, params.num_epochs + 1):
        params.cur_epoch = epoch  # BUG

        train_one_epoch(
            params=params,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            train_dl=train_dl,
            scaler=scaler,
        )


if __name__ == "__main__":
    params = AttributeDict({
        "batch_idx_train": 0, "seed": 42, "start_epoch": 1, "num_epochs": 8,
        "optimizer_name": "AdamW", "scheduler_name": "Eden", "base_lr": 1e-3,
        "warmup_steps": 200, "accumulate_grad_steps": 1, "dtype": "float32",
    })
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 64, (6 * 8, 16), generator=g)
    audio = torch.randint(0, 128, (6 * 8, 16), generator=g)
    train_dl = [{"text_tokens": text[i:i + 8], "audio_tokens": audio[i:i + 8]} for i in range(0, 48, 8)]
    run(params, train_dl)

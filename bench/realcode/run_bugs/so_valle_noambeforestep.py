"""VALL-E trainer that steps its learning-rate scheduler before the optimizer on every update.

Source: https://github.com/lifeiteng/vall-e/commit/b14deee82fe6f37213ffc4bca17990ad5ffe6a60
("Fix Trainer warning"), read at its parent cfd909c0a67382d9a6702bf2a740e96139bd55cb
(valle/bin/trainer.py: train_one_epoch; valle/modules/scheduler.py: NoamScheduler,
get_scheduler).

Theirs: NoamScheduler and get_scheduler's Noam branch, and train_one_epoch's update block
(GradScaler, accumulate_grad_steps, unscale + clip for a non-ScaledAdam optimizer, then the
scheduler loop, then scaler.step(optimizer)). Ours: `--scheduler-name Noam --optimizer-name
AdamW` (two of their options; the defaults are icefall's Eden and ScaledAdam), decoder_dim 64,
base_lr 0.05 with warmup_steps 20; a small token model and random text/audio-token batches
instead of the VALL-E model and lhotse data; 3 epochs of 8 batches; NoamScheduler's `verbose`
argument dropped (the installed torch's LRScheduler no longer takes it); no validation,
checkpoints or logging; CPU, fp32.

The bug: `scheduler.step()` runs before `scaler.step(optimizer)` in every update, so the
schedule is always one step ahead of the parameters (the first update already uses the second
value of the Noam warm-up) and torch warns "Detected call of `lr_scheduler.step()` before
`optimizer.step()`". The fix moves the scheduler loop after the optimizer step.
"""
import logging

import torch
from torch import nn


class AttributeDict(dict):
    def __getattr__(self, key):
        return self[key]

    def __setattr__(self, key, value):
        self[key] = value


def calc_lr(step, dim_embed, warmup_steps):
    return dim_embed ** (-0.5) * min(
        step ** (-0.5), step * warmup_steps ** (-1.5)
    )


class NoamScheduler(torch.optim.lr_scheduler._LRScheduler):
    def __init__(
        self,
        base_lr: float,
        optimizer: torch.optim.Optimizer,
        dim_embed: int,
        warmup_steps: int,
        last_epoch: int = -1,
    ) -> None:

        self.dim_embed = dim_embed
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.num_param_groups = len(optimizer.param_groups)

        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> float:
        lr = self.base_lr * calc_lr(
            self._step_count, self.dim_embed, self.warmup_steps
        )
        return [lr] * self.num_param_groups

    def set_step(self, step: int):
        self._step_count = step


class Eden:
    """Placeholder for icefall's Eden (not used with --scheduler-name Noam)."""


def get_scheduler(params, optimizer):
    if params.scheduler_name.lower() == "noam":
        scheduler = NoamScheduler(
            params.base_lr,
            optimizer,
            params.decoder_dim,
            warmup_steps=params.warmup_steps,
        )
    else:
        raise NotImplementedError(f"{params.scheduler_name}")

    return scheduler


class TokenModel(nn.Module):
    """Ours: a small text-to-audio-token model standing in for VALL-E."""

    def __init__(self, num_text_tokens=64, num_audio_tokens=128, dim=64):
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

        with torch.autocast("cpu", enabled=params.use_fp16):
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

                for k in range(params.accumulate_grad_steps):
                    if isinstance(scheduler, Eden):
                        scheduler.step_batch(params.batch_idx_train)
                    else:
                        scheduler.step()  # BUG

                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()

    print(f"Epoch {params.cur_epoch}, loss {loss_info['loss'] / loss_info['frames']:.4f}, "
          f"lr: {scheduler.get_last_lr()[0]:.2e}")


def run(params, train_dl):
    torch.manual_seed(params.seed)
    model = TokenModel(dim=params.decoder_dim)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=params.base_lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=1e-2,
    )
    scheduler = get_scheduler(params, optimizer)
    optimizer.zero_grad()

    scaler = torch.amp.GradScaler("cpu", enabled=params.use_fp16)

    for epoch in range(params.start_epoch, params.num_epochs + 1):
        params.cur_epoch = epoch
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
        "batch_idx_train": 0, "seed": 42, "start_epoch": 1, "num_epochs": 3,
        "optimizer_name": "AdamW", "scheduler_name": "Noam", "base_lr": 0.05,
        "decoder_dim": 64, "warmup_steps": 20, "accumulate_grad_steps": 1, "use_fp16": False,
    })
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 64, (8 * 8, 16), generator=g)
    audio = torch.randint(0, 128, (8 * 8, 16), generator=g)
    train_dl = [{"text_tokens": text[i:i + 8], "audio_tokens": audio[i:i + 8]} for i in range(0, 64, 8)]
    run(params, train_dl)

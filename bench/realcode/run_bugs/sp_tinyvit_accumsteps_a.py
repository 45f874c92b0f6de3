"""Source: https://github.com/microsoft/Cream/commit/4a097a58d70364f40ccb2c7e8ca6c5e3961dcb40 ("fix scheduler", TinyViT)
Original: microsoft/Cream TinyViT/main.py (main and train_one_epoch) and TinyViT/lr_scheduler.py (build_scheduler),
read at 4a097a5^.
Bug: with gradient accumulation the scheduler is stepped once per optimizer update, with the update index
(epoch * num_steps + idx) // ACCUMULATION_STEPS, but build_scheduler is given len(data_loader_train) batches per
epoch, so its warmup and cosine horizon are ACCUMULATION_STEPS times too long: the warmup never ends within the
run and the learning rate never decays. The fix passes len(data_loader_train) // ACCUMULATION_STEPS.
Theirs: build_scheduler (num_steps, warmup_steps from epochs * n_iter_per_epoch, cosine with t_in_epochs=False),
train_one_epoch's accumulation (loss / ACCUMULATION_STEPS, update_grad on every ACCUMULATION_STEPS-th batch,
zero_grad and step_update there), the per-step loss.item() bookkeeping.
Ours: CosineLRScheduler is a small stand-in for timm's (timm is not installed) with the same step_update
contract; NativeScalerWithGradNormCount without AMP; a small CNN for TinyViT, random images, one process (no DDP),
no mixup, no validation, the config as a namespace.
"""
import math
from types import SimpleNamespace

import torch

torch.manual_seed(0)


class CosineLRScheduler:
    """Stand-in for timm.scheduler.CosineLRScheduler(t_in_epochs=False): linear warmup, then one cosine cycle."""

    def __init__(self, optimizer, t_initial, lr_min, warmup_lr_init, warmup_t, cycle_limit=1, t_in_epochs=False):
        self.optimizer = optimizer
        self.t_initial, self.lr_min = t_initial, lr_min
        self.warmup_lr_init, self.warmup_t = warmup_lr_init, warmup_t
        self.base_values = [group["lr"] for group in optimizer.param_groups]
        self.step_update(0)

    def _get_lr(self, t):
        if t < self.warmup_t:
            return [self.warmup_lr_init + t * (v - self.warmup_lr_init) / self.warmup_t for v in self.base_values]
        t = t - self.warmup_t
        total = self.t_initial - self.warmup_t
        if t >= total:
            return [self.lr_min for _ in self.base_values]
        return [self.lr_min + 0.5 * (v - self.lr_min) * (1 + math.cos(math.pi * t / total)) for v in self.base_values]

    def step_update(self, num_updates):
        for group, lr in zip(self.optimizer.param_groups, self._get_lr(num_updates)):
            group["lr"] = lr


def build_scheduler(config, optimizer, n_iter_per_epoch):
    num_steps = int(config.TRAIN.EPOCHS * n_iter_per_epoch)
    warmup_steps = int(config.TRAIN.WARMUP_EPOCHS * n_iter_per_epoch)
    return CosineLRScheduler(
        optimizer,
        t_initial=num_steps,
        lr_min=config.TRAIN.MIN_LR,
        warmup_lr_init=config.TRAIN.WARMUP_LR,
        warmup_t=warmup_steps,
        cycle_limit=1,
        t_in_epochs=False,
    )


class NativeScalerWithGradNormCount:
    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True):
        loss.backward(create_graph=create_graph)
        norm = None
        if update_grad:
            norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            optimizer.step()
        return norm

    def state_dict(self):
        return {"scale": 1.0}


class AverageMeter:
    def __init__(self):
        self.val, self.sum, self.count, self.avg = 0.0, 0.0, 0, 0.0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def train_one_epoch(config, model, criterion, data_loader, optimizer, epoch, lr_scheduler, loss_scaler):
    model.train()
    optimizer.zero_grad()
    num_steps = len(data_loader)
    loss_meter = AverageMeter()
    for idx, (samples, targets) in enumerate(data_loader):
        outputs = model(samples)
        loss = criterion(outputs, targets)
        loss = loss / config.TRAIN.ACCUMULATION_STEPS

        loss_scaler(loss, optimizer, clip_grad=config.TRAIN.CLIP_GRAD, parameters=model.parameters(),
                    create_graph=False, update_grad=(idx + 1) % config.TRAIN.ACCUMULATION_STEPS == 0)
        if (idx + 1) % config.TRAIN.ACCUMULATION_STEPS == 0:
            optimizer.zero_grad()
            lr_scheduler.step_update((epoch * num_steps + idx) // config.TRAIN.ACCUMULATION_STEPS)
        loss_meter.update(loss.item(), targets.size(0))
    return loss_meter.avg


def main(config):
    g = torch.Generator().manual_seed(1)
    images = torch.randn(16 * 8, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (16 * 8,), generator=g)
    data_loader_train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=8,
                                                    shuffle=True, generator=g)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.GELU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.TRAIN.BASE_LR, weight_decay=0.05)
    loss_scaler = NativeScalerWithGradNormCount()
    lr_scheduler = build_scheduler(config, optimizer, len(data_loader_train))  # BUG
    criterion = torch.nn.CrossEntropyLoss()
    for epoch in range(config.TRAIN.START_EPOCH, config.TRAIN.EPOCHS):
        loss = train_one_epoch(config, model, criterion, data_loader_train, optimizer, epoch, lr_scheduler,
                               loss_scaler)
        print(f"epoch {epoch} loss {loss:.4f} lr {optimizer.param_groups[0]['lr']:.6f}")


if __name__ == "__main__":
    config = SimpleNamespace(TRAIN=SimpleNamespace(
        START_EPOCH=0, EPOCHS=6, WARMUP_EPOCHS=1, BASE_LR=2e-3, MIN_LR=2e-5, WARMUP_LR=2e-6,
        ACCUMULATION_STEPS=4, CLIP_GRAD=5.0,
    ))
    main(config)

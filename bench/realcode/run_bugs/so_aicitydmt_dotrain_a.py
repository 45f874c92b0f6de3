"""Source: https://github.com/heshuting555/AICITY2020_DMT_VehicleReID/issues/18
Original: heshuting555/AICITY2020_DMT_VehicleReID processor/processor.py (do_train), train.py (the
WarmupMultiStepLR built from cfg.SOLVER) and config/defaults.py, read at c67d119.
Bug: do_train calls scheduler.step() at the top of every epoch, before any optimizer.step() of that epoch, so
PyTorch warns "Detected call of `lr_scheduler.step()` before `optimizer.step()`" and the first value of the
warmup schedule is skipped: every epoch trains with the learning rate meant for the next one, and each decay
milestone arrives one epoch early. The maintainer answered it is only a warning; the reporter asked where to move
the call (after the epoch's optimizer steps).
Theirs: do_train's shape (meters, evaluator reset, scheduler.step() then model.train() per epoch, the two
optimizers with the center optimizer's zero_grad, loss_fn(score, feat, target), accuracy and loss.item()
bookkeeping, checkpoint and eval periods), WarmupMultiStepLR's arguments from cfg.SOLVER (linear warmup, factor
0.01, gamma 0.1).
Ours: WarmupMultiStepLR written here (their solver file is not in the index; the usual reid-baseline
warmup-multistep formula), a tiny backbone with _freeze_stages in place of the ResNet, cross-entropy plus a
feature-norm term for their softmax-triplet loss, random images, CPU, 6 epochs with warmup 3 and steps (4, 5),
evaluation and checkpoint periods left at 10 (not reached), a plain logger.
"""
import logging
import time
from bisect import bisect_right
from types import SimpleNamespace

import torch
import torch.nn as nn

torch.manual_seed(0)
logging.basicConfig(level=logging.INFO, format="%(message)s")


class WarmupMultiStepLR(torch.optim.lr_scheduler.LRScheduler):
    def __init__(self, optimizer, milestones, gamma=0.1, warmup_factor=1.0 / 3, warmup_iters=500,
                 warmup_method="linear", last_epoch=-1):
        self.milestones = list(milestones)
        self.gamma = gamma
        self.warmup_factor = warmup_factor
        self.warmup_iters = warmup_iters
        self.warmup_method = warmup_method
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        warmup_factor = 1
        if self.last_epoch < self.warmup_iters:
            if self.warmup_method == "constant":
                warmup_factor = self.warmup_factor
            elif self.warmup_method == "linear":
                alpha = self.last_epoch / self.warmup_iters
                warmup_factor = self.warmup_factor * (1 - alpha) + alpha
        return [base_lr * warmup_factor * self.gamma ** bisect_right(self.milestones, self.last_epoch)
                for base_lr in self.base_lrs]


class AverageMeter:
    def __init__(self):
        self.reset()

    def reset(self):
        self.val, self.avg, self.sum, self.count = 0, 0, 0, 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.layer = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())

    def _freeze_stages(self):
        pass  # their frozen-stage count is 0 by default

    def forward(self, x):
        return self.layer(self.stem(x)).mean(dim=(2, 3))


class Baseline(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.base = Backbone()
        self.bottleneck = nn.BatchNorm1d(16)
        self.classifier = nn.Linear(16, num_classes, bias=False)

    def forward(self, x, label=None):
        global_feat = self.base(x)
        feat = self.bottleneck(global_feat)
        if self.training:
            return self.classifier(feat), global_feat
        return feat


def do_train(cfg, model, center_criterion, train_loader, val_loader, optimizer, optimizer_center, scheduler,
             loss_fn, num_query):
    log_period = cfg.SOLVER.LOG_PERIOD
    checkpoint_period = cfg.SOLVER.CHECKPOINT_PERIOD
    eval_period = cfg.SOLVER.EVAL_PERIOD
    epochs = cfg.SOLVER.MAX_EPOCHS

    logger = logging.getLogger("reid_baseline.train")
    logger.info('start training')

    loss_meter = AverageMeter()
    acc_meter = AverageMeter()
    model.base._freeze_stages()
    # train
    for epoch in range(1, epochs + 1):
        start_time = time.time()
        loss_meter.reset()
        acc_meter.reset()
        scheduler.step()  # BUG
        model.train()
        for n_iter, (img, vid) in enumerate(train_loader):
            optimizer.zero_grad()
            optimizer_center.zero_grad()
            target = vid

            score, feat = model(img, target)
            loss = loss_fn(score, feat, target)

            loss.backward()
            optimizer.step()
            if 'center' in cfg.MODEL.METRIC_LOSS_TYPE:
                for param in center_criterion.parameters():
                    param.grad.data *= (1. / cfg.SOLVER.CENTER_LOSS_WEIGHT)
                optimizer_center.step()

            acc = (score.max(1)[1] == target).float().mean()
            loss_meter.update(loss.item(), img.shape[0])
            acc_meter.update(acc, 1)

            if (n_iter + 1) % log_period == 0:
                logger.info(f"Epoch[{epoch}] Iteration[{n_iter + 1}/{len(train_loader)}] Loss: {loss_meter.avg:.3f}, Acc: {acc_meter.avg:.3f}, Base Lr: {scheduler.get_last_lr()[0]:.2e}"
                            )

        end_time = time.time()
        time_per_batch = (end_time - start_time) / (n_iter + 1)
        logger.info(f"Epoch {epoch} done. Time per batch: {time_per_batch:.3f}[s]")

        if epoch % checkpoint_period == 0:
            pass  # theirs: torch.save(model.state_dict(), ...)

        if epoch % eval_period == 0:
            model.eval()


if __name__ == "__main__":
    cfg = SimpleNamespace(
        MODEL=SimpleNamespace(METRIC_LOSS_TYPE="triplet"),
        SOLVER=SimpleNamespace(MAX_EPOCHS=6, BASE_LR=3e-4, STEPS=(4, 5), GAMMA=0.1, WARMUP_FACTOR=0.01,
                               WARMUP_EPOCHS=3, WARMUP_METHOD="linear", LOG_PERIOD=2, CHECKPOINT_PERIOD=10,
                               EVAL_PERIOD=10, CENTER_LR=0.5, CENTER_LOSS_WEIGHT=0.0005),
    )
    g = torch.Generator().manual_seed(1)
    train_loader = [(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 8, (8,), generator=g))
                    for _ in range(4)]
    model = Baseline(num_classes=8)
    center_criterion = nn.Linear(16, 8)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.SOLVER.BASE_LR, weight_decay=0.0005)
    optimizer_center = torch.optim.SGD(center_criterion.parameters(), lr=cfg.SOLVER.CENTER_LR)
    scheduler = WarmupMultiStepLR(optimizer, cfg.SOLVER.STEPS, cfg.SOLVER.GAMMA, cfg.SOLVER.WARMUP_FACTOR,
                                  cfg.SOLVER.WARMUP_EPOCHS, cfg.SOLVER.WARMUP_METHOD)

    def loss_fn(score, feat, target):
        return nn.functional.cross_entropy(score, target) + 1e-3 * feat.pow(2).sum(dim=1).mean()

    do_train(cfg, model, center_criterion, train_loader, None, optimizer, optimizer_center, scheduler, loss_fn,
             num_query=0)

"""Source: https://github.com/IDEA-Research/DAB-DETR/issues/58
Original: IDEA-Research/DAB-DETR engine.py (train_one_epoch), read at 372250b in the search index.
Bug: train_one_epoch calls optimizer.zero_grad() only in the AMP branch; the default (args.amp False) branch runs
losses.backward(), clips and steps without ever clearing the gradients, so every step adds its gradient to all the
earlier ones. The maintainer: "It can be viewed as a bug in our implementation, but with little influence on the
final performance" (the 0.1 gradient clipping bounds the update).
Theirs: train_one_epoch's shape (GradScaler(enabled=args.amp), need_tgt_for_training from args.use_dn,
model.train()/criterion.train(), the loss_dict * weight_dict sum, reduce_dict and the scaled/unscaled logging
copies, loss_value = .item() with the isfinite stop, the two backward branches, clip_grad_norm_ with max_norm,
metric updates, the returned stats).
Ours: a tiny set-prediction model and an L1/CE criterion with weight_dict instead of DAB-DETR and its Hungarian
matcher, MetricLogger/SmoothedValue reduced to running means, reduce_dict as the single-process identity,
random images and targets, CPU, one epoch of 12 steps.
"""
import math
import sys
from collections import defaultdict
from types import SimpleNamespace

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class MetricLogger:
    def __init__(self, delimiter="\t"):
        self.meters = defaultdict(list)
        self.delimiter = delimiter

    def log_every(self, iterable, print_freq, header=None, logger=None):
        yield from iterable

    def update(self, **kwargs):
        for k, v in kwargs.items():
            self.meters[k].append(float(v))

    def global_avg(self):
        return {k: sum(v) / len(v) for k, v in self.meters.items() if v}


def reduce_dict(input_dict, average=True):
    return input_dict  # single process: nothing to reduce


class TinyDETR(torch.nn.Module):
    def __init__(self, num_queries=10, num_classes=5, dim=32):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Conv2d(3, dim, 3, stride=2, padding=1), torch.nn.ReLU(),
                                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.query_embed = torch.nn.Embedding(num_queries, dim)
        self.class_embed = torch.nn.Linear(dim, num_classes + 1)
        self.bbox_embed = torch.nn.Linear(dim, 4)

    def forward(self, samples, targets=None):
        h = self.backbone(samples)[:, None, :] + self.query_embed.weight[None]
        return {"pred_logits": self.class_embed(h), "pred_boxes": self.bbox_embed(h).sigmoid()}


class SetCriterion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight_dict = {"loss_ce": 1.0, "loss_bbox": 5.0}

    def forward(self, outputs, targets):
        labels = torch.stack([t["labels"] for t in targets])
        boxes = torch.stack([t["boxes"] for t in targets])
        loss_ce = F.cross_entropy(outputs["pred_logits"].flatten(0, 1), labels.flatten())
        loss_bbox = F.l1_loss(outputs["pred_boxes"], boxes)
        return {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "class_error": torch.tensor(0.0)}


def train_one_epoch(model: torch.nn.Module, criterion: torch.nn.Module, data_loader, optimizer: torch.optim.Optimizer,
                    device: torch.device, epoch: int, max_norm: float = 0, wo_class_error=False, lr_scheduler=None,
                    args=None, logger=None, ema_m=None):
    scaler = torch.amp.GradScaler("cpu", enabled=args.amp)

    try:
        need_tgt_for_training = args.use_dn
    except AttributeError:
        need_tgt_for_training = False

    model.train()
    criterion.train()
    metric_logger = MetricLogger(delimiter="  ")
    header = f'Epoch: [{epoch}]'
    print_freq = 10

    _cnt = 0
    for samples, targets in metric_logger.log_every(data_loader, print_freq, header, logger=logger):
        samples = samples.to(device)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]

        with torch.autocast("cpu", enabled=args.amp):
            if need_tgt_for_training:
                outputs = model(samples, targets)
            else:
                outputs = model(samples)

            loss_dict = criterion(outputs, targets)
            weight_dict = criterion.weight_dict
            losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict.keys() if k in weight_dict)

        # reduce losses over all GPUs for logging purposes
        loss_dict_reduced = reduce_dict(loss_dict)
        loss_dict_reduced_unscaled = {f'{k}_unscaled': v for k, v in loss_dict_reduced.items()}
        loss_dict_reduced_scaled = {k: v * weight_dict[k] for k, v in loss_dict_reduced.items() if k in weight_dict}
        losses_reduced_scaled = sum(loss_dict_reduced_scaled.values())

        loss_value = losses_reduced_scaled.item()

        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training")
            print(loss_dict_reduced)
            sys.exit(1)

        # amp backward function
        if args.amp:
            optimizer.zero_grad()
            scaler.scale(losses).backward()
            if max_norm > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            # original backward function
            losses.backward()  # BUG
            if max_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()

        metric_logger.update(loss=loss_value, **loss_dict_reduced_scaled, **loss_dict_reduced_unscaled)
        if 'class_error' in loss_dict_reduced:
            metric_logger.update(class_error=loss_dict_reduced['class_error'])
        metric_logger.update(lr=optimizer.param_groups[0]["lr"])

        _cnt += 1
        if args.debug:
            if _cnt % 15 == 0:
                print("BREAK!" * 5)
                break

    resstat = metric_logger.global_avg()
    print("Averaged stats:", {k: round(v, 4) for k, v in resstat.items()})
    return resstat


if __name__ == "__main__":
    args = SimpleNamespace(amp=False, use_dn=False, debug=False)
    g = torch.Generator().manual_seed(1)
    data_loader = []
    for _ in range(12):
        samples = torch.randn(2, 3, 32, 32, generator=g)
        targets = [{"labels": torch.randint(0, 6, (10,), generator=g), "boxes": torch.rand(10, 4, generator=g)}
                   for _ in range(2)]
        data_loader.append((samples, targets))
    model, criterion = TinyDETR(), SetCriterion()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    train_one_epoch(model, criterion, data_loader, optimizer, torch.device("cpu"), 0, max_norm=0.1, args=args)

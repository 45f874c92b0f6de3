# Source: https://github.com/facebookresearch/fairseq/issues/2255 (fixed in 8eb9123)
# Original: facebookresearch/fairseq fairseq/criterions/masked_lm.py (MaskedLmLoss.forward, reduce_metrics),
# fairseq/logging/meters.py (AverageMeter) and fairseq/logging/metrics.py (log_scalar); from the issue text
# Bug: the criterion puts the loss tensor itself in its logging_output dict ('loss': loss, not loss.data). The
# trainer hands the logging outputs to reduce_metrics, which sums them into a logged AverageMeter: the meter's running
# sum keeps every update's autograd graph alive until the aggregator is reset at the end of the epoch.
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class AverageMeter:
    def __init__(self, round=None):
        self.round = round
        self.reset()

    def reset(self):
        self.val, self.sum, self.count = None, 0, 0

    def update(self, val, n=1):
        if val is not None:
            self.val = val
            if n > 0:
                self.sum = self.sum + val * n  # BUG
                self.count += n

    @property
    def avg(self):
        return self.sum / self.count if self.count > 0 else self.val


_aggregators = OrderedDict(train=OrderedDict())


def log_scalar(key, value, weight=1, round=None):
    for agg in _aggregators.values():
        if key not in agg:
            agg[key] = AverageMeter(round=round)
        agg[key].update(value, weight)


def reset_meters(name):
    for meter in _aggregators[name].values():
        meter.reset()


class MaskedLmLoss(torch.nn.Module):
    def __init__(self, padding_idx):
        super().__init__()
        self.padding_idx = padding_idx

    def forward(self, model, sample):
        masked_tokens = sample["target"].ne(self.padding_idx)
        sample_size = int(masked_tokens.sum())
        logits = model(sample["src_tokens"])[masked_tokens]
        targets = sample["target"][masked_tokens]
        loss = F.nll_loss(F.log_softmax(logits.view(-1, logits.size(-1)), dim=-1, dtype=torch.float32),
                          targets.view(-1), reduction="sum")
        logging_output = {
            "loss": loss,
            "ntokens": sample["ntokens"],
            "nsentences": sample["nsentences"],
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs):
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        log_scalar("loss", loss_sum / sample_size / math.log(2), sample_size, round=3)


class Trainer:
    def __init__(self, model, criterion, optimizer, update_freq):
        self.model, self.criterion, self.optimizer, self.update_freq = model, criterion, optimizer, update_freq

    def train_step(self, samples):
        self.model.train()
        self.optimizer.zero_grad()
        logging_outputs, sample_size = [], 0
        for sample in samples:
            loss, sample_size_i, logging_output = self.criterion(self.model, sample)
            loss.backward()
            logging_outputs.append(logging_output)
            sample_size += sample_size_i
        for p in self.model.parameters():
            p.grad.div_(sample_size)
        self.optimizer.step()
        self.criterion.reduce_metrics(logging_outputs)


vocab, pad = 50, 1
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 64), torch.nn.Linear(64, 128), torch.nn.GELU(),
                            torch.nn.Linear(128, vocab))
trainer = Trainer(model, MaskedLmLoss(pad), torch.optim.Adam(model.parameters(), lr=1e-3), update_freq=2)


def sample():
    tokens = torch.randint(2, vocab, (8, 32))
    target = torch.where(torch.rand(8, 32) < 0.15, tokens, torch.full_like(tokens, pad))
    return {"src_tokens": tokens, "target": target, "ntokens": 256, "nsentences": 8}


for epoch in range(3):
    for step in range(60):
        trainer.train_step([sample() for _ in range(trainer.update_freq)])
    print("epoch", epoch, "loss", round(float(_aggregators["train"]["loss"].avg), 3))
    reset_meters("train")

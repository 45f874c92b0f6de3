"""Source: https://github.com/meta-recsys/generative-recommenders/commit/6886aee78bf7fef14393bf57f12d203939461db0
("Fix missing optimizer's zero_grad()", PR #332). Read: generative_recommenders/dlrm_v3/train/utils.py at the
fix's parent (6886aee^), function train_loop.

Bug: train_loop backpropagates the sum of the auxiliary losses and steps the optimizer for every sample, but never
clears the gradients, so each step applies the sum of all gradients since the start. The fix added
`optimizer.zero_grad()` at the top of the loop.

Theirs: train_loop's body (model.train(), the double loop, `model.forward(uih, candidates)` returning a 6-tuple,
`sum(aux_losses.values()).backward()`, metric_logger.update / compute_and_log with the same `!=` test, the
num_batches breaks, the checkpoint call at the end). Ours: a tiny two-tower model standing in for the DLRMv3 HSTU
(random dense features instead of KeyedJaggedTensors), a minimal MetricsLogger, a Sample with .to(), the
checkpoint written to a temporary folder, no profiler (output_trace off).
"""
import os
import tempfile

import torch
from torch.optim import Optimizer

torch.manual_seed(0)


class Sample:
    def __init__(self, uih: torch.Tensor, cand: torch.Tensor, labels: torch.Tensor) -> None:
        self.uih_features_kjt = uih
        self.candidates_features_kjt = cand
        self.labels = labels

    def to(self, device: torch.device) -> None:
        self.uih_features_kjt = self.uih_features_kjt.to(device)
        self.candidates_features_kjt = self.candidates_features_kjt.to(device)
        self.labels = self.labels.to(device)


class TinyRanker(torch.nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.user = torch.nn.Sequential(torch.nn.Linear(dim, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        self.item = torch.nn.Sequential(torch.nn.Linear(dim, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        self.head = torch.nn.Linear(16, 2)
        self.current_labels: torch.Tensor | None = None

    def forward(self, uih: torch.Tensor, cand: torch.Tensor):
        logits = self.head(self.user(uih) * self.item(cand))
        labels = self.current_labels
        weights = torch.ones_like(labels)
        aux_losses = {
            "click": torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], labels[:, 0]),
            "like": torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 1], labels[:, 1]),
        }
        return None, None, aux_losses, torch.sigmoid(logits), labels, weights


class MetricsLogger:
    def __init__(self) -> None:
        self.seen: list[float] = []

    def update(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> None:
        self.seen.append(((predictions > 0.5).float() == labels).float().mean().item())

    def compute_and_log(self, additional_logs: dict[str, dict[str, torch.Tensor]] | None = None) -> None:
        losses = {k: round(v.item(), 4) for k, v in (additional_logs or {}).get("losses", {}).items()}
        print("acc", round(sum(self.seen[-10:]) / len(self.seen[-10:]), 3), losses)


def save_dmp_checkpoint(model: torch.nn.Module, optimizer: Optimizer, rank: int) -> None:
    path = os.path.join(tempfile.mkdtemp(), f"ckpt_rank{rank}.pt")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def train_loop(
    rank: int,
    model: torch.nn.Module,
    dataloader,
    optimizer: Optimizer,
    metric_logger: MetricsLogger,
    device: torch.device,
    num_epochs: int,
    num_batches: int | None = None,
    output_trace: bool = False,
    metric_log_frequency: int = 1,
) -> None:
    model = model.train()
    batch_idx: int = 0

    for _ in range(num_epochs):
        for sample in dataloader:
            sample.to(device)
            model.current_labels = sample.labels
            (
                _,
                _,
                aux_losses,
                mt_target_preds,
                mt_target_labels,
                mt_target_weights,
            ) = model.forward(
                sample.uih_features_kjt,
                sample.candidates_features_kjt,
            )
            sum(aux_losses.values()).backward()  # BUG
            optimizer.step()
            metric_logger.update(
                predictions=mt_target_preds,
                labels=mt_target_labels,
                weights=mt_target_weights,
            )
            if batch_idx % metric_log_frequency != 0:
                metric_logger.compute_and_log(
                    additional_logs={
                        "losses": aux_losses,
                    }
                )
            batch_idx += 1
            if num_batches is not None and batch_idx >= num_batches:
                break
        if num_batches is not None and batch_idx >= num_batches:
            break

    save_dmp_checkpoint(model, optimizer, rank)


def make_dataloader(n: int = 40, bs: int = 32, dim: int = 16) -> list[Sample]:
    rule = torch.randn(dim, 2)
    out = []
    for _ in range(n):
        uih, cand = torch.randn(bs, dim), torch.randn(bs, dim)
        out.append(Sample(uih, cand, ((uih * cand) @ rule > 0).float()))
    return out


model = TinyRanker()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
train_loop(0, model, make_dataloader(), optimizer, MetricsLogger(), torch.device("cpu"), num_epochs=2,
           num_batches=60, metric_log_frequency=10)

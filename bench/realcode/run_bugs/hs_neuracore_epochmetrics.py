# Source: https://github.com/NeuracoreAI/neuracore/pull/893 (commit bf28161)
# Original: NeuracoreAI/neuracore neuracore/ml/trainers/distributed_trainer.py (DistributedTrainer.train_epoch,
# _accumulate_epoch_metrics, _average_epoch_metrics), at bf28161^
# Bug: every training step reads each loss and each metric back to the host with .item() to append them to the
# epoch's lists, and once more for the progress bar's postfix even when the bar is disabled (cloud runs): a device
# sync per loss and per metric per step (fix: accumulate on device, read back once per epoch).
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

torch.manual_seed(0)


@dataclass
class BatchedTrainingOutputs:
    losses: dict
    metrics: dict


class TinyPolicy(nn.Module):
    """An action-chunking policy head: predicts the next 4 joint targets from a state vector."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(14, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4 * 7))

    def training_step(self, batch):
        state, actions = batch
        pred = self.net(state).view(-1, 4, 7)
        l1 = F.l1_loss(pred, actions)
        smooth = (pred[:, 1:] - pred[:, :-1]).pow(2).mean()
        return BatchedTrainingOutputs(
            losses={"l1_loss": l1, "smoothness_loss": 0.1 * smooth},
            metrics={"first_action_error": (pred[:, 0] - actions[:, 0]).abs().mean(),
                     "gripper_error": (pred[..., -1] - actions[..., -1]).abs().mean()})


class DistributedTrainer:
    def __init__(self, model, train_loader, log_to_cloud=True):
        self.model, self.train_loader, self.log_to_cloud = model, train_loader, log_to_cloud
        self.optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-3)]
        self.schedulers = []
        self.clip_grad_norm = 1.0
        self.rank, self.global_train_step = 0, 0

    def train_epoch(self, epoch):
        self.model.train()
        epoch_losses, epoch_metrics = [], []
        pbar = tqdm(self.train_loader, desc=f"Training Epoch {epoch}", disable=self.rank != 0 or self.log_to_cloud)
        for optimizer in self.optimizers:
            optimizer.zero_grad()
        for batch_idx, batch in enumerate(pbar):
            batch_output = self.model.training_step(batch)
            loss = torch.stack(list(batch_output.losses.values()), dim=0).sum(dim=0).mean()
            loss.backward()
            if self.clip_grad_norm:
                nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
            for optimizer in self.optimizers:
                optimizer.step()
            pbar.set_postfix({"loss": f"{loss.item():.4f}", "step": self.global_train_step})
            epoch_losses, epoch_metrics = self._accumulate_epoch_metrics(batch_output, epoch_losses, epoch_metrics)
            self.global_train_step += 1
            for optimizer in self.optimizers:
                optimizer.zero_grad()
            del batch, batch_output, loss
        return self._average_epoch_metrics(epoch_losses, epoch_metrics, epoch)

    def _accumulate_epoch_metrics(self, batch_output, epoch_losses, epoch_metrics):
        if batch_output.losses:
            epoch_losses.append({
                k: v.item() if isinstance(v, torch.Tensor) else v  # BUG
                for k, v in batch_output.losses.items()
            })
        if batch_output.metrics:
            epoch_metrics.append({
                k: v.item() if isinstance(v, torch.Tensor) else v
                for k, v in batch_output.metrics.items()
            })
        return epoch_losses, epoch_metrics

    def _average_epoch_metrics(self, epoch_losses, epoch_metrics, epoch):
        avg_epoch_losses = {k: sum(x[k] for x in epoch_losses) / len(epoch_losses) for k in epoch_losses[0]}
        avg_epoch_metrics = {k: sum(x[k] for x in epoch_metrics) / len(epoch_metrics) for k in epoch_metrics[0]}
        return avg_epoch_losses, avg_epoch_metrics


states = torch.randn(1024, 14)
targets = torch.tanh(states[:, :7, None].transpose(1, 2).repeat(1, 4, 1) * torch.linspace(1, 0.5, 4)[None, :, None])
loader = DataLoader(TensorDataset(states, targets), batch_size=32, shuffle=True)
trainer = DistributedTrainer(TinyPolicy(), loader)
for epoch in range(3):
    losses, metrics = trainer.train_epoch(epoch)
    print(f"epoch {epoch} " + " ".join(f"{k} {v:.4f}" for k, v in {**losses, **metrics}.items()))

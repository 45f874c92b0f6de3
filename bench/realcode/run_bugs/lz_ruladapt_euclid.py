# Source: https://github.com/tilman151/rul-adapt/pull/22
# Original: tilman151/rul-adapt rul_adapt/loss/utils.py (_euclidean, _calc_pairwise_distances) and
# rul_adapt/loss/adaption.py (MaximumMeanDiscrepancyLoss, a torchmetrics.Metric used as a loss), read at a0470b9 and
# 008f9c4; rul_adapt/approach/mmd.py (MmdApproach.training_step) from the same tree, trimmed
# Bug: the pairwise distance is sqrt((x - y) ** 2) summed over features, and the MMD compares every feature vector
# with itself: on the diagonal x - y is exactly 0, so the forward is finite but sqrt's backward is 1 / (2 * 0) = inf,
# times 0 = NaN. Every gradient of the feature extractor is NaN from the first step and the weights turn NaN.
from collections.abc import Callable

import lightning as L
import torch
import torchmetrics
from torch import nn


def weighted_mean(inputs: list[torch.Tensor], weights: list[torch.Tensor]) -> torch.Tensor:
    torch_weights = torch.stack(weights).float()
    torch_weights /= torch.sum(torch_weights)
    return torch.sum(torch.stack(inputs) * torch_weights)


def calc_pairwise_euclidean(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _calc_pairwise_distances(x, y, _euclidean)


def _calc_pairwise_distances(x: torch.Tensor, y: torch.Tensor, dist_func: Callable) -> torch.Tensor:
    num_elems = x.shape[0]
    x = x.view(num_elems, 1, -1)
    y = y.view(1, num_elems, -1)
    return dist_func(x, y)


def _euclidean(x, y):
    return torch.sqrt((x - y) ** 2).sum(-1)  # BUG


def _get_gammas(distances: torch.Tensor, num_kernels: int) -> list[float]:
    n_samples = distances.shape[0]
    bandwidth = (n_samples**2 - n_samples) / torch.sum(distances.detach())
    bandwidth /= 2 ** (num_kernels // 2)
    return [bandwidth * (2**i) for i in range(num_kernels)]


def _calc_multi_kernel(distances: torch.Tensor, gammas: list[float]) -> torch.Tensor:
    kernels = [torch.exp(-distances * gamma) for gamma in gammas]
    return sum(kernels) / len(gammas)


def _calc_discrepancy(distances: torch.Tensor, batch_size: int) -> torch.Tensor:
    s2s = distances[:batch_size, :batch_size]
    t2t = distances[batch_size:, batch_size:]
    s2t = distances[:batch_size, batch_size:]
    return torch.mean(s2s + t2t - 2 * s2t)


class MaximumMeanDiscrepancyLoss(torchmetrics.Metric):
    is_differentiable = True
    higher_is_better = False
    full_state_update = False

    def __init__(self, num_kernels: int) -> None:
        super().__init__()
        self.num_kernels = num_kernels
        self.add_state("loss", [], dist_reduce_fx="cat")
        self.add_state("total", [], dist_reduce_fx="cat")

    def update(self, source_features: torch.Tensor, target_features: torch.Tensor) -> None:
        feats = torch.cat([source_features, target_features], dim=0)
        distances = calc_pairwise_euclidean(feats, feats)
        gammas = _get_gammas(distances, self.num_kernels)
        distances = _calc_multi_kernel(distances, gammas)
        batch_size = source_features.shape[0]
        self.loss.append(_calc_discrepancy(distances, batch_size))
        self.total.append(torch.tensor(batch_size))

    def compute(self) -> torch.Tensor:
        return weighted_mean(self.loss, self.total)


class MmdApproach(L.LightningModule):
    def __init__(self, mmd_factor: float, num_mmd_kernels: int, lr: float):
        super().__init__()
        self.mmd_factor = mmd_factor
        self.lr = lr
        self.feature_extractor = nn.Sequential(nn.Conv1d(14, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 28, 8),
                                               nn.ReLU())
        self.regressor = nn.Linear(8, 1)
        self.train_source_loss = nn.MSELoss()
        self.mmd_loss = MaximumMeanDiscrepancyLoss(num_mmd_kernels)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    def training_step(self, batch, batch_idx):
        source, source_labels, target = batch
        source_features = self.feature_extractor(source)
        target_features = self.feature_extractor(target)
        rul_preds = self.regressor(source_features).squeeze(-1)
        mse_loss = self.train_source_loss(rul_preds, source_labels)
        mmd_loss = self.mmd_loss(source_features, target_features)
        loss = mse_loss + self.mmd_factor * mmd_loss
        self.log("train/loss", loss)
        return loss


def make_loader(n=256):
    # CMAPSS-like windows: 14 sensors x 30 cycles; the target domain is shifted
    source = torch.randn(n, 14, 30)
    labels = source[:, :3].mean(dim=(1, 2)) * 10 + 60
    target = torch.randn(n, 14, 30) * 1.3 + 0.4
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(source, labels, target), batch_size=32,
                                       shuffle=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    approach = MmdApproach(mmd_factor=1.0, num_mmd_kernels=5, lr=1e-3)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(approach, make_loader())
    print("first weight finite:", bool(torch.isfinite(approach.feature_extractor[0].weight).all()))

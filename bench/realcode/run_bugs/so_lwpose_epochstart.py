"""Lightweight OpenPose training that steps its MultiStepLR at the top of each epoch, before any optimizer step.

Source: https://github.com/Daniil-Osokin/lightweight-human-pose-estimation.pytorch/issues/142
("How to correct the problem?": the `lr_scheduler.step()` before `optimizer.step()` warning)
Original: Daniil-Osokin/lightweight-human-pose-estimation.pytorch train.py (train: the per-group Adam,
MultiStepLR(milestones=[100, 200, 260], gamma=0.333), the epoch loop), read at a70ef04; l2_loss as in
modules/loss.py.
Bug: `scheduler.step()` is the first statement of every epoch, so the schedule runs one epoch ahead of
the optimizer: torch warns on the first call and skips the initial value, and each milestone decay lands
one epoch early (with milestones 100/200/260 the drops happen after epochs 99/199/259).
Ours: milestones [2, 4] over 5 epochs so the shift shows in a short run, a two-stage conv stand-in for
the MobileNet pose network, random images, heatmaps and PAFs, CPU, no DataParallel, checkpoints or
validation; the per-step .item() loss bookkeeping is theirs.
"""
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)


def l2_loss(input, target, mask, batch_size):
    loss = (input - target) * mask
    loss = (loss * loss) / 2 / batch_size
    return loss.sum()


class CocoTrainDataset(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        return {"image": torch.rand(3, 32, 32, generator=g),
                "keypoint_mask": torch.ones(19, 4, 4), "paf_mask": torch.ones(38, 4, 4),
                "keypoint_maps": torch.rand(19, 4, 4, generator=g), "paf_maps": torch.rand(38, 4, 4, generator=g)}


class PoseEstimationWithMobileNet(nn.Module):
    def __init__(self, num_refinement_stages=1):
        super().__init__()
        self.model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
                                   nn.Conv2d(32, 32, 3, 2, 1), nn.ReLU())
        self.initial_stage = nn.Conv2d(32, 19 + 38, 1)
        self.refinement_stages = nn.ModuleList([nn.Conv2d(32 + 19 + 38, 19 + 38, 3, 1, 1)
                                                for _ in range(num_refinement_stages)])

    def forward(self, x):
        features = self.model(x)
        out = self.initial_stage(features)
        stages_output = [out[:, :19], out[:, 19:]]
        for stage in self.refinement_stages:
            out = stage(torch.cat([features, stages_output[-2], stages_output[-1]], 1))
            stages_output.extend([out[:, :19], out[:, 19:]])
        return stages_output


def train(num_refinement_stages, base_lr, batch_size, batches_per_iter, num_workers, log_after):
    net = PoseEstimationWithMobileNet(num_refinement_stages)
    train_loader = DataLoader(CocoTrainDataset(), batch_size=batch_size, shuffle=True, num_workers=num_workers)
    optimizer = optim.Adam([
        {"params": net.model.parameters()},
        {"params": net.initial_stage.parameters(), "lr": base_lr},
        {"params": net.refinement_stages.parameters(), "lr": base_lr * 4},
    ], lr=base_lr, weight_decay=5e-4)

    num_iter = 0
    current_epoch = 0
    drop_after_epoch = [2, 4]
    scheduler = optim.lr_scheduler.MultiStepLR(optimizer, milestones=drop_after_epoch, gamma=0.333)

    net.train()
    for epochId in range(current_epoch, 5):
        scheduler.step()  # BUG
        total_losses = [0, 0] * (num_refinement_stages + 1)
        batch_per_iter_idx = 0
        for batch_data in train_loader:
            if batch_per_iter_idx == 0:
                optimizer.zero_grad()

            images = batch_data["image"]
            keypoint_masks = batch_data["keypoint_mask"]
            paf_masks = batch_data["paf_mask"]
            keypoint_maps = batch_data["keypoint_maps"]
            paf_maps = batch_data["paf_maps"]

            stages_output = net(images)

            losses = []
            for loss_idx in range(len(total_losses) // 2):
                losses.append(l2_loss(stages_output[loss_idx * 2], keypoint_maps, keypoint_masks, images.shape[0]))
                losses.append(l2_loss(stages_output[loss_idx * 2 + 1], paf_maps, paf_masks, images.shape[0]))
                total_losses[loss_idx * 2] += losses[-2].item() / batches_per_iter
                total_losses[loss_idx * 2 + 1] += losses[-1].item() / batches_per_iter

            loss = losses[0]
            for loss_idx in range(1, len(losses)):
                loss += losses[loss_idx]
            loss /= batches_per_iter
            loss.backward()
            batch_per_iter_idx += 1
            if batch_per_iter_idx == batches_per_iter:
                optimizer.step()
                batch_per_iter_idx = 0
                num_iter += 1
            else:
                continue

            if num_iter % log_after == 0:
                print(f"Iter: {num_iter} (epoch {epochId}, lr {optimizer.param_groups[0]['lr']:.3g})")
                for loss_idx in range(len(total_losses)):
                    total_losses[loss_idx] = 0


train(num_refinement_stages=1, base_lr=4e-5, batch_size=16, batches_per_iter=1, num_workers=0, log_after=4)

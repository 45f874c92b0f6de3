# Source: https://github.com/minar09/cp-vton-plus/issues/69 (confirmed by the maintainer, "Sure, please go ahead and
#   submit a PR"; the reporter notes the same in sergeywong/cp-vton)
# Original: minar09/cp-vton-plus train.py (train_gmm / train_tom)
# Bug: the paper's schedule (the LR fixed for keep_step steps, then decayed linearly to zero over decay_step) is built
# as a LambdaLR, but scheduler.step() is never called, so the whole run trains at the initial LR.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def get_opt():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.0001)
    parser.add_argument("--keep_step", type=int, default=30)
    parser.add_argument("--decay_step", type=int, default=30)
    parser.add_argument("--display_count", type=int, default=20)
    return parser.parse_args([])


class CPDataLoader:
    def __init__(self, n=16):
        self.g = torch.Generator().manual_seed(0)
        self.n = n

    def next_batch(self):
        return {"agnostic": torch.randn(self.n, 6, 16, 12, generator=self.g),
                "cloth": torch.randn(self.n, 3, 16, 12, generator=self.g),
                "parse_cloth": torch.randn(self.n, 3, 16, 12, generator=self.g)}


class GMM(nn.Module):
    """A stand-in for the geometric matching module: predicts a sampling grid from person and cloth."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(9, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d((4, 3)))
        self.regression = nn.Linear(16 * 12, 6)

    def forward(self, agnostic, cloth):
        theta = self.regression(self.features(torch.cat([agnostic, cloth], 1)).flatten(1)).view(-1, 2, 3)
        theta = theta + torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        grid = F.affine_grid(theta, cloth.shape, align_corners=False)
        return grid, theta


def train_gmm(opt, train_loader, model):
    model.train()
    criterionL1 = nn.L1Loss()
    optimizer = torch.optim.Adam(model.parameters(), lr=opt.lr, betas=(0.5, 0.999))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: 1.0 - max(0, step - opt.keep_step) / float(opt.decay_step + 1))  # BUG

    for step in range(opt.keep_step + opt.decay_step):
        inputs = train_loader.next_batch()
        c, im_c = inputs["cloth"], inputs["parse_cloth"]
        grid, theta = model(inputs["agnostic"], c)
        warped_cloth = F.grid_sample(c, grid, padding_mode="border", align_corners=False)
        loss = criterionL1(warped_cloth, im_c)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if (step + 1) % opt.display_count == 0:
            print(f"step: {step + 1:8d}, loss: {loss.item():4f}, lr: {optimizer.param_groups[0]['lr']:g}")
    return scheduler


def main():
    torch.manual_seed(0)
    opt = get_opt()
    scheduler = train_gmm(opt, CPDataLoader(), GMM())
    print("scheduler steps taken:", scheduler.last_epoch, "of", opt.keep_step + opt.decay_step)


if __name__ == "__main__":
    main()

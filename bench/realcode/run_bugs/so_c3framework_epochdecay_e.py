"""C^3 Framework crowd-counting Trainer that steps its StepLR at the top of each epoch, before training.

Source: https://github.com/gjy3035/C-3-Framework/issues/96 (torch's "Detected call of
`lr_scheduler.step()` before `optimizer.step()`" warning, reported against the trainer)
Original: gjy3035/C-3-Framework trainer.py (Trainer.__init__ / forward / train / validate_V1, read at
0242883), models/CC.py (CrowdCounter: the density map and its MSE loss) and config.py's schedule
(LR_DECAY 0.995 per epoch, LR_DECAY_START -1, NUM_EPOCH_LR_DECAY 1).
Bug: Trainer.forward calls `self.scheduler.step()` at the start of every epoch (LR_DECAY_START is -1, so
from the first one), before self.train() has taken any optimizer step: the first learning rate of the
schedule is never used and every epoch runs one decay ahead. The issue is open and unanswered.
Ours: a three-conv density regressor instead of the VGG/ResNet backbones, random images and density
maps, CPU, 3 epochs; tensorboard, timers, checkpoints and the GCC/WE validations are left out.
"""
import numpy as np
import torch
import torch.nn as nn
from torch import optim
from torch.autograd import Variable
from torch.optim.lr_scheduler import StepLR

torch.manual_seed(0)


class cfg:
    LR = 1e-5
    LR_DECAY = 0.995
    LR_DECAY_START = -1
    NUM_EPOCH_LR_DECAY = 1
    MAX_EPOCH = 3
    PRINT_FREQ = 4
    VAL_FREQ = 1
    VAL_DENSE_START = 50


class cfg_data:
    LOG_PARA = 100.


class AverageMeter:
    def __init__(self):
        self.sum, self.count, self.avg = 0.0, 0, 0.0

    def update(self, val):
        self.sum += val
        self.count += 1
        self.avg = self.sum / self.count


class CrowdCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.CCN = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 1, 1))
        self.loss_mse_fn = nn.MSELoss()

    @property
    def loss(self):
        return self.loss_mse

    def forward(self, img, gt_map):
        density_map = self.CCN(img)
        self.loss_mse = self.build_loss(density_map.squeeze(), gt_map.squeeze())
        return density_map

    def build_loss(self, density_map, gt_data):
        return self.loss_mse_fn(density_map, gt_data)


def dataloader():
    imgs = torch.rand(80, 3, 32, 32)
    maps = torch.rand(80, 32, 32) * cfg_data.LOG_PARA * 0.01
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(imgs[:48], maps[:48]), batch_size=8, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(imgs[48:], maps[48:]), batch_size=8)
    return train, val, None


class Trainer:
    def __init__(self, dataloader, cfg_data):
        self.cfg_data = cfg_data
        self.net = CrowdCounter()
        self.optimizer = optim.Adam(self.net.CCN.parameters(), lr=cfg.LR, weight_decay=1e-4)
        self.scheduler = StepLR(self.optimizer, step_size=cfg.NUM_EPOCH_LR_DECAY, gamma=cfg.LR_DECAY)
        self.epoch = 0
        self.i_tb = 0
        self.train_loader, self.val_loader, self.restore_transform = dataloader()

    def forward(self):
        for epoch in range(self.epoch, cfg.MAX_EPOCH):
            self.epoch = epoch
            if epoch > cfg.LR_DECAY_START:
                self.scheduler.step()  # BUG

            self.train()
            if epoch % cfg.VAL_FREQ == 0 or epoch > cfg.VAL_DENSE_START:
                self.validate_V1()

    def train(self):
        self.net.train()
        for i, data in enumerate(self.train_loader, 0):
            img, gt_map = data
            img = Variable(img)
            gt_map = Variable(gt_map)

            self.optimizer.zero_grad()
            pred_map = self.net(img, gt_map)
            loss = self.net.loss
            loss.backward()
            self.optimizer.step()

            if (i + 1) % cfg.PRINT_FREQ == 0:
                self.i_tb += 1
                print(f"[ep {self.epoch + 1}][it {i + 1}][loss {loss.item():.4f}]"
                      f"[lr {self.optimizer.param_groups[0]['lr'] * 10000:.4f}]")

    def validate_V1(self):
        self.net.eval()
        losses = AverageMeter()
        maes = AverageMeter()
        for vi, data in enumerate(self.val_loader, 0):
            img, gt_map = data
            with torch.no_grad():
                pred_map = self.net.forward(img, gt_map)
                pred_map = pred_map.data.cpu().numpy()
                gt_map = gt_map.data.cpu().numpy()
                for i_img in range(pred_map.shape[0]):
                    pred_cnt = np.sum(pred_map[i_img]) / self.cfg_data.LOG_PARA
                    gt_count = np.sum(gt_map[i_img]) / self.cfg_data.LOG_PARA
                    losses.update(self.net.loss.item())
                    maes.update(abs(gt_count - pred_cnt))
        print(f"    [mae {maes.avg:.2f}][val loss {losses.avg:.4f}]")


cc_trainer = Trainer(dataloader, cfg_data)
cc_trainer.forward()

# Source: https://github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/1100
# Original: junyanz/pytorch-CycleGAN-and-pix2pix train.py (epoch loop) and models/base_model.py
# (BaseModel.update_learning_rate), 2020 version; models/networks.py (get_scheduler, 'linear' policy)
# Bug: train.py calls model.update_learning_rate() at the beginning of every epoch, so the schedulers step before any
# optimizer step (torch's order warning) and the linear decay runs one epoch ahead: the last epoch trains at LR 0.
import torch
import torch.nn as nn
from torch.optim import lr_scheduler

torch.manual_seed(0)


class Opt:
    n_epochs, n_epochs_decay, epoch_count = 3, 3, 1
    lr, beta1, lambda_L1, lr_policy, batch_size = 2e-4, 0.5, 100.0, "linear", 4


def get_scheduler(optimizer, opt):
    def lambda_rule(epoch):
        return 1.0 - max(0, epoch + opt.epoch_count - opt.n_epochs) / float(opt.n_epochs_decay + 1)
    return lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda_rule)


class Pix2PixModel:
    def __init__(self, opt):
        self.opt = opt
        self.netG = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 3, 3, padding=1), nn.Tanh())
        self.netD = nn.Sequential(nn.Conv2d(6, 16, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(16, 1, 4, 1, 1))
        self.criterionGAN = nn.BCEWithLogitsLoss()
        self.criterionL1 = nn.L1Loss()
        self.optimizer_G = torch.optim.Adam(self.netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
        self.optimizer_D = torch.optim.Adam(self.netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
        self.optimizers = [self.optimizer_G, self.optimizer_D]

    def setup(self, opt):
        self.schedulers = [get_scheduler(optimizer, opt) for optimizer in self.optimizers]

    def update_learning_rate(self):
        old_lr = self.optimizers[0].param_groups[0]["lr"]
        for scheduler in self.schedulers:
            scheduler.step()  # BUG
        lr = self.optimizers[0].param_groups[0]["lr"]
        print(f"learning rate {old_lr:.7f} -> {lr:.7f}")

    def set_input(self, data):
        self.real_A, self.real_B = data

    def backward_D(self):
        pred_fake = self.netD(torch.cat((self.real_A, self.fake_B), 1).detach())
        pred_real = self.netD(torch.cat((self.real_A, self.real_B), 1))
        self.loss_D = 0.5 * (self.criterionGAN(pred_fake, torch.zeros_like(pred_fake))
                             + self.criterionGAN(pred_real, torch.ones_like(pred_real)))
        self.loss_D.backward()

    def backward_G(self):
        pred_fake = self.netD(torch.cat((self.real_A, self.fake_B), 1))
        self.loss_G = (self.criterionGAN(pred_fake, torch.ones_like(pred_fake))
                       + self.criterionL1(self.fake_B, self.real_B) * self.opt.lambda_L1)
        self.loss_G.backward()

    def optimize_parameters(self):
        self.fake_B = self.netG(self.real_A)
        self.netD.requires_grad_(True)
        self.optimizer_D.zero_grad()
        self.backward_D()
        self.optimizer_D.step()
        self.netD.requires_grad_(False)
        self.optimizer_G.zero_grad()
        self.backward_G()
        self.optimizer_G.step()


def create_dataset(n=24, size=12):
    real_B = torch.rand(n, 3, size, size) * 2 - 1
    real_A = real_B.mean(1, keepdim=True).expand(-1, 3, -1, -1)  # colourisation: grey in, colour out
    return [(real_A[i:i + Opt.batch_size], real_B[i:i + Opt.batch_size]) for i in range(0, n, Opt.batch_size)]


opt = Opt()
dataset = create_dataset()
model = Pix2PixModel(opt)
model.setup(opt)
total_iters = 0
for epoch in range(opt.epoch_count, opt.n_epochs + opt.n_epochs_decay + 1):
    epoch_iter = 0
    model.update_learning_rate()  # update learning rates in the beginning of every epoch.
    for i, data in enumerate(dataset):
        total_iters += opt.batch_size
        epoch_iter += opt.batch_size
        model.set_input(data)
        model.optimize_parameters()
    print(f"End of epoch {epoch} / {opt.n_epochs + opt.n_epochs_decay}: G {model.loss_G.item():.3f} "
          f"D {model.loss_D.item():.3f}")

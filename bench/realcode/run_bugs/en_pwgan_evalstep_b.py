# Source: https://github.com/kan-bayashi/ParallelWaveGAN/pull/26
# Original: kan-bayashi/ParallelWaveGAN parallel_wavegan/bin/train.py (Trainer._eval_step, Trainer._eval_epoch)
# Bug: the evaluation epoch puts the generator and discriminator in eval mode but runs _eval_step without
# torch.no_grad(): every dev batch builds the autograd graph of both networks and of the STFT losses, for
# nothing but .item() values (extra memory during evaluation).
from collections import defaultdict

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Generator(torch.nn.Module):
    def __init__(self, aux_channels=8, channels=16, upsample=32):
        super().__init__()
        self.upsample = upsample
        self.first = torch.nn.Conv1d(1, channels, 1)
        self.layers = torch.nn.ModuleList([torch.nn.Conv1d(channels + aux_channels, channels, 3, padding=d, dilation=d)
                                           for d in (1, 2, 4, 8)])
        self.last = torch.nn.Conv1d(channels, 1, 1)

    def forward(self, z, c):
        c = F.interpolate(c, scale_factor=self.upsample)
        x = self.first(z)
        for layer in self.layers:
            x = x + torch.tanh(layer(torch.cat([x, c], 1)))
        return self.last(x)


class Discriminator(torch.nn.Module):
    def __init__(self, channels=16):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv1d(1, channels, 3, padding=1), torch.nn.LeakyReLU(0.2),
                                       torch.nn.Conv1d(channels, channels, 3, padding=2, dilation=2),
                                       torch.nn.LeakyReLU(0.2), torch.nn.Conv1d(channels, 1, 3, padding=1))

    def forward(self, x):
        return self.net(x)


class STFTLoss(torch.nn.Module):
    def __init__(self, fft_size=128, hop=32):
        super().__init__()
        self.fft_size, self.hop = fft_size, hop
        self.register_buffer("window", torch.hann_window(fft_size))

    def magnitude(self, x):
        spec = torch.stft(x, self.fft_size, self.hop, window=self.window, return_complex=True)
        return torch.clamp(spec.abs(), min=1e-7)

    def forward(self, x, y):
        x_mag, y_mag = self.magnitude(x), self.magnitude(y)
        sc_loss = torch.norm(y_mag - x_mag, p="fro") / torch.norm(y_mag, p="fro")
        mag_loss = F.l1_loss(torch.log(y_mag), torch.log(x_mag))
        return sc_loss, mag_loss


class Trainer:
    def __init__(self, data_loader, model, criterion, optimizer, config):
        self.data_loader, self.model, self.criterion = data_loader, model, criterion
        self.optimizer, self.config = optimizer, config
        self.steps = 0
        self.total_train_loss = defaultdict(float)
        self.total_eval_loss = defaultdict(float)

    def _train_step(self, batch):
        z, c, y = batch
        y_ = self.model["generator"](z, c)
        y, y_ = y.squeeze(1), y_.squeeze(1)
        sc_loss, mag_loss = self.criterion["stft"](y_, y)
        gen_loss = sc_loss + mag_loss
        if self.steps > self.config["discriminator_train_start_steps"]:
            p_ = self.model["discriminator"](y_.unsqueeze(1)).squeeze(1)
            adv_loss = self.criterion["mse"](p_, p_.new_ones(p_.size()))
            gen_loss += self.config["lambda_adv"] * adv_loss
        self.total_train_loss["train/generator_loss"] += gen_loss.item()
        self.optimizer["generator"].zero_grad()
        gen_loss.backward()
        self.optimizer["generator"].step()
        if self.steps > self.config["discriminator_train_start_steps"]:
            p = self.model["discriminator"](y.unsqueeze(1)).squeeze(1)
            p_ = self.model["discriminator"](y_.unsqueeze(1).detach()).squeeze(1)
            dis_loss = self.criterion["mse"](p, p.new_ones(p.size())) + self.criterion["mse"](p_, p_.new_zeros(p_.size()))
            self.total_train_loss["train/discriminator_loss"] += dis_loss.item()
            self.optimizer["discriminator"].zero_grad()
            dis_loss.backward()
            self.optimizer["discriminator"].step()
        self.steps += 1

    def _train_epoch(self):
        for batch in self.data_loader["train"]:
            self._train_step(batch)
            if self.steps % self.config["eval_interval_steps"] == 0:
                self._eval_epoch()

    def _eval_step(self, batch):
        z, c, y = batch
        y_ = self.model["generator"](z, c)  # BUG
        p_ = self.model["discriminator"](y_)
        y, y_, p_ = y.squeeze(1), y_.squeeze(1), p_.squeeze(1)
        adv_loss = self.criterion["mse"](p_, p_.new_ones(p_.size()))
        sc_loss, mag_loss = self.criterion["stft"](y_, y)
        gen_loss = sc_loss + mag_loss + self.config["lambda_adv"] * adv_loss
        p = self.model["discriminator"](y.unsqueeze(1)).squeeze(1)
        p_ = self.model["discriminator"](y_.unsqueeze(1)).squeeze(1)
        dis_loss = self.criterion["mse"](p, p.new_ones(p.size())) + self.criterion["mse"](p_, p_.new_zeros(p_.size()))
        self.total_eval_loss["eval/generator_loss"] += gen_loss.item()
        self.total_eval_loss["eval/discriminator_loss"] += dis_loss.item()

    def _eval_epoch(self):
        for key in self.model.keys():
            self.model[key].eval()
        for eval_steps_per_epoch, batch in enumerate(self.data_loader["dev"], 1):
            self._eval_step(batch)
        for key in self.total_eval_loss.keys():
            self.total_eval_loss[key] /= eval_steps_per_epoch
        print(f"(steps: {self.steps})", {k: round(v, 4) for k, v in self.total_eval_loss.items()})
        self.total_eval_loss = defaultdict(float)
        for key in self.model.keys():
            self.model[key].train()

    def run(self, epochs):
        for epoch in range(epochs):
            self._train_epoch()


def make_batches(n, batch_size=4, frames=16, upsample=32):
    batches = []
    for _ in range(n):
        c = torch.randn(batch_size, 8, frames)
        t = torch.arange(frames * upsample) / 800
        y = torch.sin(2 * torch.pi * (100 + 50 * c[:, :1, :1]) * t).view(batch_size, 1, -1)
        batches.append((torch.randn(batch_size, 1, frames * upsample), c, y))
    return batches


model = {"generator": Generator(), "discriminator": Discriminator()}
criterion = {"stft": STFTLoss(), "mse": torch.nn.MSELoss()}
optimizer = {"generator": torch.optim.Adam(model["generator"].parameters(), lr=1e-4),
             "discriminator": torch.optim.Adam(model["discriminator"].parameters(), lr=5e-5)}
config = {"discriminator_train_start_steps": 6, "lambda_adv": 4.0, "eval_interval_steps": 6}
trainer = Trainer({"train": make_batches(12), "dev": make_batches(3)}, model, criterion, optimizer, config)
trainer.run(epochs=2)

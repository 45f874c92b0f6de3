"""pSp training resumed with --checkpoint_path: the weights come back, the optimizer starts empty.

Source: https://github.com/eladrich/pixel2style2pixel/issues/189 (open: "Did you resume learning rate and optimizer
phase by 'checkpoint_path'? ... I didn't find it in the code")
Read: models/psp.py at 2fba1b0b4d22de8c71188481be3edccf1413ee94 (pSp.load_weights, get_keys) and training/coach.py
at 0753a448f7d92a4013cc9de9d40fad53f383b462 (Coach.__init__, train, configure_optimizers, checkpoint_me,
__get_save_dict).
Theirs: pSp builds encoder + decoder and calls load_weights() in its constructor, which restores encoder/decoder
from opts.checkpoint_path via get_keys; Coach builds the net, then a fresh Adam in configure_optimizers, trains with
zero_grad/backward/step and saves {'state_dict', 'opts'} in checkpoint_me (no optimizer, no step).
Ours: a tiny conv encoder and MLP decoder instead of the IR-SE50 encoder and StyleGAN2 generator (random init
instead of the irse50/stylegan downloads), an L2 loss only, random image pairs, CPU, a first short run that writes
the checkpoint the second run resumes from, in a temporary folder.
"""
import os
import shutil
import tempfile
from argparse import Namespace

import torch
import torch.nn.functional as F
from torch import nn


def get_keys(d, name):
    if "state_dict" in d:
        d = d["state_dict"]
    d_filt = {k[len(name) + 1:]: v for k, v in d.items() if k[:len(name)] == name}
    return d_filt


class GradualStyleEncoder(nn.Module):
    def __init__(self, n_styles=4, style_dim=16):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.PReLU(8), nn.Conv2d(8, 16, 3, 2, 1), nn.PReLU(16))
        self.styles = nn.Linear(16 * 8 * 8, n_styles * style_dim)
        self.n_styles, self.style_dim = n_styles, style_dim

    def forward(self, x):
        return self.styles(self.body(x).flatten(1)).view(-1, self.n_styles, self.style_dim)


class Generator(nn.Module):
    def __init__(self, n_styles=4, style_dim=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_styles * style_dim, 256), nn.LeakyReLU(0.2), nn.Linear(256, 3 * 32 * 32))

    def forward(self, styles, input_is_latent=True, return_latents=False):
        codes = styles[0]
        images = self.net(codes.flatten(1)).view(-1, 3, 32, 32)
        return images, (codes if return_latents else None)


class pSp(nn.Module):
    def __init__(self, opts):
        super().__init__()
        self.opts = opts
        self.encoder = GradualStyleEncoder()
        self.decoder = Generator()
        self.latent_avg = None
        # Load weights if needed
        self.load_weights()

    def load_weights(self):
        if self.opts.checkpoint_path is not None:
            print(f"Loading pSp from checkpoint: {self.opts.checkpoint_path}")
            ckpt = torch.load(self.opts.checkpoint_path, map_location="cpu")
            self.encoder.load_state_dict(get_keys(ckpt, "encoder"), strict=True)  # BUG
            self.decoder.load_state_dict(get_keys(ckpt, "decoder"), strict=True)

    def forward(self, x, return_latents=False):
        codes = self.encoder(x)
        images, result_latent = self.decoder([codes], input_is_latent=True, return_latents=return_latents)
        if return_latents:
            return images, result_latent
        return images


class Coach:
    def __init__(self, opts, train_dataloader):
        self.opts = opts
        self.global_step = 0
        self.net = pSp(self.opts)
        self.optimizer = self.configure_optimizers()
        self.train_dataloader = train_dataloader
        self.checkpoint_dir = os.path.join(opts.exp_dir, "checkpoints")
        os.makedirs(self.checkpoint_dir, exist_ok=True)

    def train(self):
        self.net.train()
        while self.global_step < self.opts.max_steps:
            for batch_idx, batch in enumerate(self.train_dataloader):
                self.optimizer.zero_grad()
                x, y = batch
                y_hat, latent = self.net.forward(x, return_latents=True)
                loss, loss_dict = self.calc_loss(y, y_hat)
                loss.backward()
                self.optimizer.step()
                if self.global_step % self.opts.save_interval == 0 or self.global_step == self.opts.max_steps:
                    self.checkpoint_me(loss_dict)
                if self.global_step == self.opts.max_steps:
                    break
                self.global_step += 1

    def checkpoint_me(self, loss_dict):
        save_name = f"iteration_{self.global_step}.pt"
        torch.save(self.__get_save_dict(), os.path.join(self.checkpoint_dir, save_name))

    def configure_optimizers(self):
        params = list(self.net.encoder.parameters())
        if self.opts.train_decoder:
            params += list(self.net.decoder.parameters())
        return torch.optim.Adam(params, lr=self.opts.learning_rate)

    def calc_loss(self, y, y_hat):
        loss_l2 = F.mse_loss(y_hat, y)
        loss = loss_l2 * self.opts.l2_lambda
        return loss, {"loss_l2": float(loss_l2), "loss": float(loss)}

    def __get_save_dict(self):
        return {"state_dict": self.net.state_dict(), "opts": vars(self.opts)}


torch.manual_seed(0)
train_dataloader = [(torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32)) for _ in range(10)]
exp_dir = tempfile.mkdtemp()
try:
    first = Namespace(exp_dir=exp_dir, checkpoint_path=None, learning_rate=1e-3, train_decoder=True,
                      l2_lambda=1.0, max_steps=25, save_interval=10)
    Coach(first, train_dataloader).train()

    resumed = Namespace(**vars(first))
    resumed.checkpoint_path = os.path.join(exp_dir, "checkpoints", "iteration_20.pt")
    resumed.max_steps = 50
    coach = Coach(resumed, train_dataloader)
    coach.train()
finally:
    shutil.rmtree(exp_dir)

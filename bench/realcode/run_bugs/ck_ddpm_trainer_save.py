# Source: https://github.com/lucidrains/denoising-diffusion-pytorch/commit/a0c3443eaa67c70f69eca0abec37798f7d991235
# Original: lucidrains/denoising-diffusion-pytorch denoising_diffusion_pytorch/denoising_diffusion_pytorch.py
# (Trainer.save / Trainer.load)
# Bug: Trainer.save writes step, model, ema and scaler but not the optimizer state (and load never restores
# it), so a resume restarts Adam's moments.
import copy
import os
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Trainer:
    def __init__(self, model, results_folder, train_num_steps=40, save_and_sample_every=10):
        self.model = model
        self.ema = copy.deepcopy(model)
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        self.step = 0
        self.train_num_steps = train_num_steps
        self.save_and_sample_every = save_and_sample_every
        self.results_folder = results_folder

    def save(self, milestone):
        data = {
            "step": self.step,
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
        }
        torch.save(data, os.path.join(self.results_folder, f"model-{milestone}.pt"))  # BUG

    def load(self, milestone):
        # as in the original: step, model and ema come back, the optimizer's state does not
        data = torch.load(os.path.join(self.results_folder, f"model-{milestone}.pt"), weights_only=True)
        self.step = data["step"]
        self.model.load_state_dict(data["model"])
        self.ema.load_state_dict(data["ema"])

    def train(self):
        while self.step < self.train_num_steps:
            x = torch.randn(8, 16)
            noise = torch.randn_like(x)
            loss = F.mse_loss(self.model(x + noise), noise)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            self.step += 1
            with torch.no_grad():
                for pe, pm in zip(self.ema.parameters(), self.model.parameters()):
                    pe.lerp_(pm, 0.005)
            if self.step % self.save_and_sample_every == 0:
                self.save(self.step // self.save_and_sample_every)


with tempfile.TemporaryDirectory() as results_folder:
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.SiLU(), torch.nn.Linear(64, 16))
    Trainer(model, results_folder).train()

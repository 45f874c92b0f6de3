# Source: synthetic: state 1 of run14 (a trainer's load() restores the model from a full checkpoint)
# Original: our own trainer class; the run writes its checkpoint, then a second Trainer resumes from it
# Bug: Trainer.load() reads the checkpoint the trainer itself writes ({'epoch', 'model', 'optimizer'}) and puts
# back the model and the epoch; the optimizer's entry is never loaded, so the resumed Adam starts with empty moments.
import os
import tempfile

import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, out_dir):
        torch.manual_seed(0)
        self.out_dir = out_dir
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 24), torch.nn.Tanh(), torch.nn.Linear(24, 1))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=3e-3)
        self.epoch = 0
        self.batches = [(torch.randn(8, 10), torch.randn(8, 1)) for _ in range(5)]

    def save(self):
        torch.save({"epoch": self.epoch, "model": self.net.state_dict(), "optimizer": self.opt.state_dict()},
                   os.path.join(self.out_dir, "last.pt"))

    def load(self, path):
        ckpt = torch.load(path)
        self.net.load_state_dict(ckpt["model"])  # BUG
        self.epoch = ckpt["epoch"]

    def fit(self, until):
        while self.epoch < until:
            for x, y in self.batches:
                self.opt.zero_grad()
                F.mse_loss(self.net(x), y).backward()
                self.opt.step()
            self.epoch += 1
            self.save()


out = tempfile.mkdtemp()
first = Trainer(out)
first.fit(2)
second = Trainer(out)
second.load(os.path.join(out, "last.pt"))
second.fit(4)
print("resumed at epoch 2, optimizer state entries at the end:", len(second.opt.state))

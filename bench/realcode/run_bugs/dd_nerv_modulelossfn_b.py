# Source: https://github.com/Wuziyi616/nerv/commit/d3fe9c502d43c7099d2b2a9d2146d32bae865ffe
# Original: Wuziyi616/nerv nerv/training/method.py (BaseMethod._loss_function, _training_step_fp32) and
# nerv/training/model.py (BaseModel.loss_function), read at d3fe9c5^; reported in pairlab/SlotFormer#9 / nerv#1
# Bug: the method wraps the model in DistributedDataParallel, but each training step computes its losses through
# self.model.module.loss_function(batch), which runs the bare module's forward: DDP's forward never runs, backward
# all-reduces nothing, and each rank trains its own copy on its own shard. The fix runs self.model(data_dict) and
# only then module.calc_train_loss. Our tiny autoencoder, weights and data; the training loop keeps nerv's shape.
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class BaseModel(nn.Module):
    def loss_function(self, data_dict):
        """General wrapper for the loss: forward, then the train or eval loss."""
        out_dict = self.forward(data_dict)
        if self.training:
            out_dict = self.calc_train_loss(data_dict, out_dict)
        else:
            with torch.no_grad():
                out_dict = self.calc_train_loss(data_dict, out_dict)
        out_dict["batch_size"] = data_dict["img"].shape[0]
        return out_dict


class SlotAE(BaseModel):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 16))
        self.decoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 48))

    def forward(self, data_dict):
        slots = self.encoder(data_dict["img"])
        return {"slots": slots, "recon": self.decoder(slots)}

    def calc_train_loss(self, data_dict, out_dict):
        return {"recon_loss": F.mse_loss(out_dict["recon"], data_dict["img"]),
                "slot_loss": out_dict["slots"].pow(2).mean()}


class Frames(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.imgs = torch.tanh(torch.randn(640, 8, generator=g) @ torch.randn(8, 48, generator=g))

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, idx):
        return {"img": self.imgs[idx]}


class Params:
    recon_loss_w = 1.0
    slot_loss_w = 0.01
    train_batch_size = 32
    lr = 2e-3
    max_epochs = 3


class BaseMethod:
    def __init__(self, model, train_set, params, local_rank):
        self.params = params
        self.local_rank = local_rank
        self.grad_accum_steps = 1
        self.clip_grad = 1.0
        self.model = DistributedDataParallel(model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=params.lr)
        self.train_loader = DataLoader(train_set, batch_size=params.train_batch_size,
                                       sampler=DistributedSampler(train_set, shuffle=True, seed=0))

    def _make_tensor(self, x):
        return torch.tensor(x)

    def _loss_function(self, batch_data):
        """Compute and aggregate losses."""
        out_dict = self.model.module.loss_function(batch_data)  # BUG
        loss = self._make_tensor(0.0)
        for loss_name, loss_value in out_dict.items():
            if not loss_name.endswith("_loss"):
                continue
            loss = loss + loss_value * getattr(self.params, f"{loss_name}_w")
        out_dict["loss"] = loss
        return out_dict

    def _training_step_fp32(self, batch_data):
        out_dict = self._loss_function(batch_data)
        loss = out_dict["loss"] / self.grad_accum_steps
        loss.backward()
        if ((self.epoch_it + 1) % self.grad_accum_steps == 0) or (self.epoch_it + 1 == len(self.iter_train_loader)):
            if self.clip_grad > 0.0:
                nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
            self.optimizer.step()
            self.optimizer.zero_grad()
        return out_dict

    def _train_epoch(self):
        self.model.train()
        self.train_loader.sampler.set_epoch(self.epoch)
        self.iter_train_loader = iter(self.train_loader)
        for batch_idx, batch_data in enumerate(self.iter_train_loader):
            self.epoch_it = batch_idx
            out_dict = self._training_step_fp32(batch_data)
        print(f"[rank {self.local_rank}] epoch {self.epoch} loss {out_dict['loss'].item():.4f}")

    def fit(self):
        for epoch in range(self.params.max_epochs):
            self.epoch = epoch
            self._train_epoch()


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    method = BaseMethod(SlotAE(), Frames(), Params(), local_rank)
    method.fit()


dist.init_process_group("gloo")
main()
dist.barrier()
dist.destroy_process_group()

# Source: https://github.com/lincc-frameworks/hyrax/pull/1008
# Original: lincc-frameworks/hyrax src/hyrax/pytorch_ignite.py (create_engine, _create_process_func,
# extract_model_method, create_trainer) and src/hyrax/models/hyrax_autoencoderv2.py (train_batch); pytorch-ignite's
# Engine is replaced by a small loop with the same process-function contract, the images are synthetic
# Bug: the engine looks the model's training method up on the unwrapped module (model.module when it is a DDP
# wrapper) and calls it once per batch; the method runs the encoder and decoder through self, so the DDP forward is
# never entered, backward all-reduces nothing, and each rank trains its own autoencoder (the PR: "distributed
# desyncing"; its fix routes the step through the DDP object).
import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel


class HyraxAutoencoderV2(nn.Module):
    def __init__(self, config, data_sample):
        super().__init__()
        self.config = config
        channels, width, height = data_sample.shape
        self.c_hid, self.latent_dim = config["base_channel_size"], config["latent_dim"]
        self.encoder = nn.Sequential(
            nn.Conv2d(channels, self.c_hid, 3, padding=1, stride=2), nn.GELU(),
            nn.Conv2d(self.c_hid, 2 * self.c_hid, 3, padding=1, stride=2), nn.GELU(),
            nn.Flatten(), nn.Linear(2 * self.c_hid * (width // 4) * (height // 4), self.latent_dim))
        self.dec_linear = nn.Sequential(nn.Linear(self.latent_dim, 2 * self.c_hid * (width // 4) * (height // 4)),
                                        nn.GELU())
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(2 * self.c_hid, self.c_hid, 3, output_padding=1, padding=1, stride=2), nn.GELU(),
            nn.ConvTranspose2d(self.c_hid, channels, 3, output_padding=1, padding=1, stride=2), nn.Tanh())
        self.shape = (width, height)
        self.criterion = nn.MSELoss()
        self.optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)

    def _eval_encoder(self, x):
        return self.encoder(x)

    def _eval_decoder(self, x):
        x = self.dec_linear(x)
        return self.decoder(x.reshape(x.shape[0], -1, self.shape[0] // 4, self.shape[1] // 4))

    def forward(self, batch):
        return self._eval_encoder(batch)

    def train_step(self, batch):
        x = batch
        z = self._eval_encoder(x)
        x_hat = self._eval_decoder(z)
        loss = self.criterion(x_hat, x)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}

    @staticmethod
    def to_tensor(data):
        return data


class Engine:
    def __init__(self, process_function):
        self.process_function = process_function
        self.output = None

    def run(self, data, max_epochs):
        for epoch in range(max_epochs):
            for batch in data:
                self.output = self.process_function(self, batch)


def _inner_loop(func, to_tensor, device, config, engine, batch):
    batch = to_tensor(batch)
    return func(batch.to(device))


def extract_model_method(model, method_name):
    wrapped = type(model) is DistributedDataParallel or type(model) is DataParallel
    return getattr(model.module if wrapped else model, method_name)  # BUG


def _create_process_func(funcname, device, model, config):
    inner_step = extract_model_method(model, funcname)
    to_tensor = extract_model_method(model, "to_tensor")
    return functools.partial(_inner_loop, inner_step, to_tensor, device, config)


def create_trainer(model, config):
    model.train()
    model = DistributedDataParallel(model)
    return Engine(_create_process_func("train_step", torch.device("cpu"), model, config)), model


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
config = {"base_channel_size": 4, "latent_dim": 16}
model = HyraxAutoencoderV2(config, data_sample=torch.zeros(3, 16, 16))
trainer, ddp_model = create_trainer(model, config)
g = torch.Generator().manual_seed(100 + rank)
loader = [torch.rand(8, 3, 16, 16, generator=g) * 2 - 1 for _ in range(10)]
trainer.run(loader, max_epochs=3)
weight = ddp_model.module.encoder[0].weight.detach().clone()
gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weight)
if rank == 0:
    print("loss", trainer.output, "max |rank0 - rank1|", (gathered[0] - gathered[1]).abs().max().item())
dist.destroy_process_group()

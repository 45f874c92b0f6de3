# Source: https://github.com/kan-bayashi/ParallelWaveGAN/issues/177
# Original: kan-bayashi/ParallelWaveGAN parallel_wavegan/bin/train.py (Trainer.run / _train_epoch, main)
# Bug: main() builds DistributedSampler(shuffle=True) for the train loader in distributed runs, but the Trainer's
# epoch loop never calls sampler.set_epoch, so every epoch each rank sees its batches in the same order (the
# maintainer added set_epoch in _train_epoch).
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, steps, epochs, data_loader, sampler, model, criterion, optimizer, scheduler, config):
        self.steps = steps
        self.epochs = epochs
        self.data_loader = data_loader
        self.sampler = sampler
        self.model = model
        self.criterion = criterion
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.config = config
        self.finish_train = False

    def run(self):
        while True:
            self._train_epoch()
            if self.finish_train:
                break

    def _train_step(self, batch):
        x, y = batch
        y_ = self.model["generator"](x)
        gen_loss = self.criterion["stft"](y_, y)
        self.optimizer["generator"].zero_grad()
        gen_loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model["generator"].parameters(), self.config["grad_norm"])
        self.optimizer["generator"].step()
        self.scheduler["generator"].step()
        self.steps += 1
        self._check_train_finish()

    def _train_epoch(self):
        for train_steps_per_epoch, batch in enumerate(self.data_loader["train"], 1):  # BUG
            self._train_step(batch)
            if self.finish_train:
                return
        self.epochs += 1

    def _check_train_finish(self):
        if self.steps >= self.config["train_max_steps"]:
            self.finish_train = True


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    config = {"grad_norm": 10.0, "train_max_steps": 32}
    dataset = TensorDataset(torch.randn(64, 1, 80), torch.randn(64, 1, 80))
    sampler = {"train": DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True)}
    data_loader = {"train": DataLoader(dataset, batch_size=4, shuffle=False, sampler=sampler["train"])}
    generator = torch.nn.Sequential(torch.nn.Conv1d(1, 8, 3, padding=1), torch.nn.Tanh(), torch.nn.Conv1d(8, 1, 3, padding=1))
    model = {"generator": DistributedDataParallel(generator)}
    optimizer = {"generator": torch.optim.Adam(model["generator"].parameters(), lr=1e-3)}
    scheduler = {"generator": torch.optim.lr_scheduler.StepLR(optimizer["generator"], step_size=200000, gamma=0.5)}
    criterion = {"stft": F.l1_loss}
    trainer = Trainer(0, 0, data_loader, sampler, model, criterion, optimizer, scheduler, config)
    trainer.run()
    if dist.get_rank() == 0:
        print("steps", trainer.steps, "epochs", trainer.epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

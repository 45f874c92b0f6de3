# Source: https://github.com/coqui-ai/TTS/issues/1611
# Original: coqui-ai/TTS TTS/utils/training.py (NoamLR) and the trainer's train_epoch / train_step (the recipes'
# lr_scheduler="NoamLR", warmup_steps=4000, with the trainer's default scheduler_after_epoch=True)
# Bug: NoamLR's warm-up is counted in optimizer steps, but the trainer steps the scheduler once per epoch, so over
# the whole run the learning rate never leaves the bottom of its warm-up. Warm-up and epochs are scaled down
# (4000 -> 200 steps, 1000 epochs -> 20 of 30 batches).
from dataclasses import dataclass

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class NoamLR(torch.optim.lr_scheduler._LRScheduler):
    def __init__(self, optimizer, warmup_steps=0.1, last_epoch=-1):
        self.warmup_steps = float(warmup_steps)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        step = max(self.last_epoch, 1)
        return [base_lr * self.warmup_steps**0.5 * min(step * self.warmup_steps**-1.5, step**-0.5)
                for base_lr in self.base_lrs]


@dataclass
class TrainerConfig:
    epochs: int = 20
    lr: float = 1e-3
    lr_scheduler: str = "NoamLR"
    lr_scheduler_params: dict = None
    scheduler_after_epoch: bool = True


class GlowTTSStandIn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.GRU(16, 32, batch_first=True)
        self.decoder = torch.nn.Linear(32, 20)

    def forward(self, text):
        return self.decoder(self.encoder(text)[0])


class Trainer:
    def __init__(self, config, model, train_samples):
        self.config = config
        self.model = model
        self.train_samples = train_samples
        self.optimizer = torch.optim.RAdam(model.parameters(), lr=config.lr)
        self.scheduler = NoamLR(self.optimizer, **config.lr_scheduler_params)

    def train_step(self, batch):
        text, mel = batch
        loss = F.l1_loss(self.model(text), mel)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if not self.config.scheduler_after_epoch:
            self.scheduler.step()
        return loss.item()

    def train_epoch(self):
        self.model.train()
        for batch in self.train_samples:
            loss = self.train_step(batch)
        if self.config.scheduler_after_epoch:
            self.scheduler.step()  # BUG
        return loss

    def fit(self):
        for epoch in range(self.config.epochs):
            loss = self.train_epoch()
            print(f"epoch {epoch} loss {loss:.4f} lr {self.optimizer.param_groups[0]['lr']:.2e}")


samples = [(torch.randn(8, 12, 16), torch.randn(8, 12, 20)) for _ in range(30)]
config = TrainerConfig(lr_scheduler_params={"warmup_steps": 200})
Trainer(config, GlowTTSStandIn(), samples).fit()

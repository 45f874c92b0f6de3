# Source: https://github.com/nodefluxio/vortex/issues/58
# Original: nodefluxio/vortex src/development/vortex/development/core/trainer/base_trainer.py and
# default_trainer.py (DefaultTrainer.train_step / train: the per-batch scheduler update)
# Bug: the default trainer steps the LR scheduler after every batch update, whatever the scheduler; an
# epoch-based MultiStepLR from the experiment config (milestones in epochs) then passes all of its milestones
# within the first epoch and the rest of the run trains at 1/100 of the configured LR. (The milestone values are
# ours; the issue names schedulers that expect a per-epoch step.)
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class BaseTrainer:
    def __init__(self, model, optimizer, scheduler, criterion):
        self.model, self.optimizer, self.scheduler, self.criterion = model, optimizer, scheduler, criterion

    def train(self, dataloader, epoch):
        self.model.train()
        epoch_loss = 0.0
        for i, (x, y) in enumerate(dataloader):
            loss = self.train_step(x, y)
            epoch_loss += loss.detach()
        return epoch_loss / len(dataloader)


class DefaultTrainer(BaseTrainer):
    def train_step(self, x, y):
        self.optimizer.zero_grad()
        loss = self.criterion(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()  # BUG
        return loss


def create_scheduler(optimizer, config):
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=config["milestones"], gamma=config["gamma"])


config = {"epochs": 6, "lr": 0.05, "milestones": [3, 5], "gamma": 0.1}
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
scheduler = create_scheduler(optimizer, config)
trainer = DefaultTrainer(model, optimizer, scheduler, F.cross_entropy)
g = torch.Generator().manual_seed(1)
dataloader = [(torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(25)]
for epoch in range(config["epochs"]):
    loss = trainer.train(dataloader, epoch)
    print("epoch", epoch, f"loss {loss.item():.4f}", "lr", optimizer.param_groups[0]["lr"])

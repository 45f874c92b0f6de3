"""Source: https://github.com/autrainer/autrainer/commit/170103bb5eed91000e907275c6df13229abb1336
("Fix Inconsistent Scheduler Step Call Positions (#23)"). Read: autrainer/training/training.py
(ModularTaskTrainer.train_steps and _train_step) and autrainer-configurations/scheduler/StepLR.yaml at the fix's
parent (170103b^).

Bug: with `training_type: step`, train_steps calls `self.scheduler.step()` after every optimisation step, while
train_epochs calls it once per epoch; the shipped StepLR configuration (`step_size: 30`, meant as epochs) then
decays the learning rate every 30 iterations, so a 300-iteration run ends with the learning rate at 1e-10 of its
start. The fix adds a `step_frequency` option (default "evaluation": once per evaluation interval, "batch" only on
request) and moves the call under it.

Theirs: the train_steps loop (model.train() each step, the loader re-iterated on StopIteration, train_step_fn,
the per-step scheduler.step(), evaluation every eval_frequency steps), _train_step verbatim, StepLR with
step_size 30 (gamma left at its default 0.1). Ours: a small MLP and random data instead of the audio models and
datasets, cfg as a namespace (iterations 300, eval_frequency 100), evaluate reduced to a dev accuracy under
no_grad, no callbacks/trackers/bookkeeping/timers.
"""
from types import SimpleNamespace

import torch

torch.manual_seed(0)


class ModularTaskTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.DEVICE = torch.device("cpu")
        x = torch.randn(1024, 20)
        y = (x[:, :4].sum(1) > 0).long() + (x[:, 4] > 1).long()
        train = torch.utils.data.TensorDataset(x[:896], y[:896], torch.arange(896))
        dev = torch.utils.data.TensorDataset(x[896:], y[896:], torch.arange(128))
        self.train_loader = torch.utils.data.DataLoader(train, batch_size=32, shuffle=True)
        self.dev_loader = torch.utils.data.DataLoader(dev, batch_size=64)
        self.model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                         torch.nn.Linear(64, 3))
        self.criterion = torch.nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=30)
        self.train_step_fn = self._train_step
        self.metrics = {}

    def train(self) -> float:
        if self.cfg.training_type == "step":
            self.train_steps()
        return max(m["dev_acc"] for m in self.metrics.values())

    def train_steps(self):
        step = 0
        self.train_loader_iter = iter(self.train_loader)
        train_loss = []
        while step < self.cfg.iterations:
            step += 1
            self.model.train()
            self.model.to(self.DEVICE)
            try:
                data, target, sample_idx = next(self.train_loader_iter)
            except StopIteration:
                self.train_loader_iter = iter(self.train_loader)
                data, target, sample_idx = next(self.train_loader_iter)
            data, target = data.to(self.DEVICE), target.to(self.DEVICE)
            l, o = self.train_step_fn(  # noqa: E741 (theirs)
                self.model,
                data,
                target,
                self.criterion,
            )
            train_loss.append(l)
            if self.scheduler:
                self.scheduler.step()  # BUG
            if step % self.cfg.eval_frequency == 0:
                train_loss = sum(train_loss) / len(train_loss)
                self.metrics[step] = {"train_loss": train_loss, "dev_acc": self.evaluate(step, self.dev_loader)}
                print(step, self.metrics[step])
                if step < self.cfg.iterations:
                    train_loss = []

    def _train_step(
        self,
        model: torch.nn.Module,
        data: torch.Tensor,
        target: torch.Tensor,
        criterion: torch.nn.Module,
    ) -> tuple[float, torch.Tensor]:
        self.optimizer.zero_grad()
        output = model(data)
        loss = criterion(output, target)
        loss.backward()
        self.optimizer.step()
        return loss.item(), output.detach()

    def evaluate(self, iteration, loader) -> float:
        self.model.eval()
        correct = 0
        with torch.no_grad():
            for data, target, _ in loader:
                correct += (self.model(data).argmax(1) == target).sum().item()
        return correct / len(loader.dataset)


cfg = SimpleNamespace(training_type="step", iterations=300, eval_frequency=100)
trainer = ModularTaskTrainer(cfg)
trainer.train()

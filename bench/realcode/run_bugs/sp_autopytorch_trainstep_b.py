# Source: https://github.com/automl/Auto-PyTorch/issues/211 (fixed by automl/Auto-PyTorch#256, step_interval)
# Original: automl/Auto-PyTorch autoPyTorch/pipeline/components/training/trainer/base_trainer.py
# (BaseTrainerComponent.train_epoch / train_step) and setup/lr_scheduler/StepLR.py (its default search space)
# Bug: the base trainer steps every LR scheduler after each batch, although the epoch-based ones (StepLR with
# its default step_size=5 epochs and gamma=0.1 here) count epochs: the LR falls tenfold every 5 batches and
# is 1e-8 of its start after the first epoch (30 batches).
import torch

torch.manual_seed(0)


class StepLRComponent:
    def __init__(self, step_size=5, gamma=0.1):
        self.step_size, self.gamma = step_size, gamma
        self.scheduler = None

    def fit(self, optimizer):
        self.scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=int(self.step_size),
                                                         gamma=float(self.gamma))
        return self


class BaseTrainerComponent:
    def prepare(self, model, criterion, optimizer, scheduler):
        self.model, self.criterion = model, criterion
        self.optimizer, self.scheduler = optimizer, scheduler

    def train_epoch(self, train_loader, epoch):
        loss_sum, N = 0.0, 0
        self.model.train()
        for step, (data, targets) in enumerate(train_loader):
            loss, outputs = self.train_step(data, targets)
            loss_sum += loss * data.size(0)
            N += data.size(0)
        return loss_sum / N

    def train_step(self, data, targets):
        data, targets = data.float(), targets.long()
        self.optimizer.zero_grad()
        outputs = self.model(data)
        loss = self.criterion(outputs, targets)
        loss.backward()
        self.optimizer.step()
        if self.scheduler:
            if "ReduceLROnPlateau" in self.scheduler.__class__.__name__:
                self.scheduler.step(loss)
            else:
                self.scheduler.step()  # BUG
        return loss.item(), outputs

    def evaluate(self, test_loader):
        self.model.eval()
        correct, N = 0, 0
        with torch.no_grad():
            for data, targets in test_loader:
                correct += (self.model(data.float()).argmax(1) == targets).sum().item()
                N += data.size(0)
        return correct / N


weights = torch.randn(20, 3)
loaders = []
for n in (30, 5):
    X = torch.randn(n * 32, 20)
    y = (X @ weights + 0.5 * torch.randn(n * 32, 3)).argmax(1)
    loaders.append(list(zip(X.split(32), y.split(32))))
train_loader, val_loader = loaders
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 3))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
scheduler = StepLRComponent().fit(optimizer).scheduler
trainer = BaseTrainerComponent()
trainer.prepare(model, torch.nn.CrossEntropyLoss(), optimizer, scheduler)
for epoch in range(1, 9):
    train_loss = trainer.train_epoch(train_loader, epoch)
    acc = trainer.evaluate(val_loader)
    print(f"epoch {epoch} train loss {train_loss:.4f} val acc {acc:.3f} lr {optimizer.param_groups[0]['lr']:.2e}")

# Source: https://github.com/wkentaro/pytorch-fcn/pull/56
# Original: wkentaro/pytorch-fcn torchfcn/trainer.py (Trainer.train_epoch / Trainer.validate)
# Bug: validate(), called mid-epoch every interval_validate iterations, sets model.eval() and never
# restores train mode, so the rest of the epoch trains with BatchNorm/dropout in eval mode.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Trainer:
    def __init__(self, model, optim, train_loader, val_loader, interval_validate=10):
        self.model, self.optim = model, optim
        self.train_loader, self.val_loader = train_loader, val_loader
        self.interval_validate = interval_validate
        self.iteration = 0

    def validate(self):
        self.model.eval()
        with torch.no_grad():
            for data, target in self.val_loader:
                F.cross_entropy(self.model(data), target)

    def train_epoch(self):
        self.model.train()
        for batch_idx, (data, target) in enumerate(self.train_loader):
            if self.iteration % self.interval_validate == 0:
                self.validate()  # BUG
            self.optim.zero_grad()
            loss = F.cross_entropy(self.model(data), target)
            loss.backward()
            self.optim.step()
            self.iteration += 1


model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.Conv2d(8, 4, 1))
train_loader = [(torch.randn(4, 3, 12, 12), torch.randint(0, 4, (4, 12, 12))) for _ in range(15)]
val_loader = [(torch.randn(4, 3, 12, 12), torch.randint(0, 4, (4, 12, 12))) for _ in range(2)]
trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), train_loader, val_loader)
for epoch in range(2):
    trainer.train_epoch()
print("done")

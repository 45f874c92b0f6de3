# Source: https://github.com/chrischoy/FCGF/issues/15
# Original: chrischoy/FCGF lib/trainer.py (AlignmentTrainer.train / _valid_epoch)
# Bug: train() runs _valid_epoch() every val_epoch_freq epochs with autograd recording; the fix wraps the
# _valid_epoch() calls in torch.no_grad().
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class AlignmentTrainer:
    def __init__(self, model, max_epoch=4, val_epoch_freq=1):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8)
        self.max_epoch, self.val_epoch_freq = max_epoch, val_epoch_freq
        self.train_data = [(torch.randn(64, 3), torch.randn(64, 3)) for _ in range(8)]
        self.val_data = [(torch.randn(64, 3), torch.randn(64, 3)) for _ in range(3)]

    def _train_epoch(self, epoch):
        self.model.train()
        for xyz0, xyz1 in self.train_data:
            self.optimizer.zero_grad()
            F0, F1 = self.model(xyz0), self.model(xyz1)
            loss = F.relu(torch.cdist(F0, F1).diagonal() - 0.1).mean()
            loss.backward()
            self.optimizer.step()

    def _valid_epoch(self):
        self.model.eval()
        hit = 0.0
        for xyz0, xyz1 in self.val_data:
            F0 = self.model(xyz0)  # BUG
            F1 = self.model(xyz1)
            hit += (torch.cdist(F0, F1).argmin(1) == torch.arange(64)).float().mean().item()
        return hit / len(self.val_data)

    def train(self):
        for epoch in range(1, self.max_epoch + 1):
            self._train_epoch(epoch)
            if epoch % self.val_epoch_freq == 0:
                val_dict = self._valid_epoch()
                print("epoch", epoch, "feature match recall", val_dict)


model = torch.nn.Sequential(torch.nn.Linear(3, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
AlignmentTrainer(model).train()

# Source: https://github.com/deepinv/deepinv/issues/390
# Original: deepinv/deepinv deepinv/training/trainer.py (Trainer.save_model, Trainer.train)
# Bug: Trainer.save_model writes the epoch, the weights, the loss history and the optimizer, but not the LR
# scheduler the trainer steps every epoch: a run resumed from the checkpoint restarts the StepLR schedule at
# its first, largest learning rate (the issue asks for scheduler.state_dict() in the checkpoint).
import os
import tempfile

import torch
import torch.nn as nn

torch.manual_seed(0)


class Trainer:
    def __init__(self, model, physics, optimizer, scheduler, train_dataloader, epochs, save_path, ckp_interval=2):
        self.model = model
        self.physics = physics
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.train_dataloader = train_dataloader
        self.epochs = epochs
        self.save_path = save_path
        self.ckp_interval = ckp_interval
        self.loss_history = []
        self.losses = [nn.MSELoss()]

    def compute_loss(self, x, y):
        x_net = self.model(y)
        loss_total = 0
        for loss_fn in self.losses:
            loss_total = loss_total + loss_fn(x_net, x)
        return loss_total

    def step(self, epoch):
        running = 0.0
        for x in self.train_dataloader:
            y = self.physics(x)
            self.optimizer.zero_grad()
            loss = self.compute_loss(x, y)
            loss.backward()
            self.optimizer.step()
            running += loss.item()
        self.loss_history.append(running / len(self.train_dataloader))

    def save_model(self, epoch, eval_psnr=None, add_info=None):
        if self.save_path is None:
            return
        if (epoch > 0 and epoch % self.ckp_interval == 0) or epoch + 1 == self.epochs:
            os.makedirs(self.save_path, exist_ok=True)
            state = {"epoch": epoch, "state_dict": self.model.state_dict(), "loss": self.loss_history,
                     "optimizer": self.optimizer.state_dict() if self.optimizer else None}
            if eval_psnr is not None:
                state["eval_psnr"] = eval_psnr
            if add_info:
                state.update(add_info)
            torch.save(state, os.path.join(self.save_path, f"ckp_{epoch}.pth.tar"))  # BUG

    def train(self):
        for epoch in range(self.epochs):
            self.model.train()
            self.step(epoch)
            if self.scheduler:
                self.scheduler.step()
            self.save_model(epoch)
            print(f"epoch {epoch} loss {self.loss_history[-1]:.4f} lr {self.scheduler.get_last_lr()[0]:.1e}")
        return self.model


class Blur(nn.Module):
    def forward(self, x):
        return torch.nn.functional.avg_pool1d(x, 3, 1, 1) + 0.01 * torch.randn_like(x)


def main():
    model = nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.ReLU(), nn.Conv1d(16, 1, 5, padding=2))
    data = [torch.randn(8, 1, 64) for _ in range(12)]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    trainer = Trainer(model, Blur(), optimizer, scheduler, data, epochs=7, save_path=tempfile.mkdtemp())
    trainer.train()


if __name__ == "__main__":
    main()

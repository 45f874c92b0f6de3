# Variant of tr_lerobot_evalpolicy (same bug, another shape; written for torchdoctor's dev set, no public source)
# Bug: a hand-written trainer calls its callbacks after every step; a sampling callback puts the network in eval
# mode to draw predictions every 20 steps and never switches it back; the trainer calls net.train() only when
# an epoch starts, so most steps of every epoch run with dropout and batch norm in eval mode.
import torch
import torch.nn as nn

torch.manual_seed(0)


class PreviewCallback:
    def __init__(self, fixed_x, every=20):
        self.fixed_x = fixed_x
        self.every = every

    def on_step_end(self, trainer):
        if trainer.global_step % self.every:
            return
        trainer.net.eval()
        with torch.no_grad():
            preview = trainer.net(self.fixed_x)
        print(f"step {trainer.global_step} preview mean {preview.mean():.4f}")


class Trainer:
    def __init__(self, net, o, crit, callbacks):
        self.net = net
        self.o = o
        self.crit = crit
        self.callbacks = callbacks
        self.global_step = 0

    def fit(self, batches, epochs):
        for epoch in range(epochs):
            self.net.train()
            for x, y in batches:
                self.o.zero_grad()
                loss = self.crit(self.net(x), y)
                loss.backward()
                self.o.step()
                self.global_step += 1
                for cb in self.callbacks:
                    cb.on_step_end(self)  # BUG


net = nn.Sequential(nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 6))
batches = [(torch.randn(16, 6), torch.randn(16, 6)) for _ in range(50)]
Trainer(net, torch.optim.Adam(net.parameters(), lr=1e-3), nn.MSELoss(),
        [PreviewCallback(torch.randn(4, 6))]).fit(batches, 2)

# Source: https://github.com/michuanhaohao/reid-strong-baseline/issues/190
# Original: michuanhaohao/reid-strong-baseline engine/trainer.py (do_train: the ignite event handlers)
# Bug: the LR scheduler is stepped by an EPOCH_STARTED event handler, so its first step runs before the first
# optimizer step and every epoch trains with the next epoch's learning rate (the warm-up's first value skipped).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Engine:
    """A small event engine in the style of ignite's: handlers run around each epoch and iteration."""

    def __init__(self, process_function):
        self.process_function = process_function
        self.handlers = {"epoch_started": [], "iteration_completed": [], "epoch_completed": []}
        self.epoch = 0
        self.iteration = 0
        self.output = None

    def on(self, event):
        def register(fn):
            self.handlers[event].append(fn)
            return fn
        return register

    def fire(self, event):
        for fn in self.handlers[event]:
            fn(self)

    def run(self, data, max_epochs):
        for epoch in range(max_epochs):
            self.epoch = epoch + 1
            self.fire("epoch_started")
            for batch in data:
                self.iteration += 1
                self.output = self.process_function(self, batch)
                self.fire("iteration_completed")
            self.fire("epoch_completed")


class WarmupMultiStepLR(torch.optim.lr_scheduler.LRScheduler):
    def __init__(self, optimizer, milestones, gamma=0.1, warmup_factor=0.1, warmup_iters=3):
        self.milestones, self.gamma = milestones, gamma
        self.warmup_factor, self.warmup_iters = warmup_factor, warmup_iters
        super().__init__(optimizer)

    def get_lr(self):
        warmup = 1.0
        if self.last_epoch < self.warmup_iters:
            alpha = self.last_epoch / self.warmup_iters
            warmup = self.warmup_factor * (1 - alpha) + alpha
        decay = self.gamma ** sum(1 for m in self.milestones if m <= self.last_epoch)
        return [base * warmup * decay for base in self.base_lrs]


def do_train(model, loader, optimizer, scheduler, epochs):
    def update(engine, batch):
        model.train()
        img, target = batch
        optimizer.zero_grad()
        score = model(img)
        loss = F.cross_entropy(score, target)
        loss.backward()
        optimizer.step()
        return loss.item()

    trainer = Engine(update)

    @trainer.on("epoch_started")
    def adjust_learning_rate(engine):
        scheduler.step()  # BUG

    @trainer.on("epoch_completed")
    def log_training_loss(engine):
        print("epoch", engine.epoch, "lr", round(scheduler.get_last_lr()[0], 6), "loss", round(engine.output, 4))

    trainer.run(loader, max_epochs=epochs)


model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=3.5e-4)
scheduler = WarmupMultiStepLR(optimizer, milestones=[6, 9])
data = [(torch.randn(16, 64), torch.randint(0, 10, (16,))) for _ in range(12)]
do_train(model, data, optimizer, scheduler, epochs=10)

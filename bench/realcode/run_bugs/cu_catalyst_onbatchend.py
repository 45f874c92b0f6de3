# Source: https://github.com/catalyst-team/catalyst/issues/1319
# Original: catalyst-team/catalyst catalyst/callbacks/optimizer.py (OptimizerCallback.on_batch_end), 21.09,
# with the AMP engine's backward_loss / optimizer_step (catalyst/engines/amp.py)
# Bug: the callback clips the gradients right after the engine's scaled backward, before the GradScaler unscales
# them in optimizer_step, so grad_clip_fn works on gradients multiplied by the loss scale.
import functools

import torch
import torch.nn.functional as F

torch.manual_seed(0)


class AMPEngine:
    def __init__(self):
        self.scaler = torch.amp.GradScaler("cpu")

    def autocast(self):
        return torch.autocast("cpu", dtype=torch.float16)

    def backward_loss(self, loss, model, optimizer):
        self.scaler.scale(loss).backward()

    def optimizer_step(self, loss, model, optimizer):
        self.scaler.step(optimizer)
        self.scaler.update()

    def zero_grad(self, loss, model, optimizer):
        model.zero_grad()


class OptimizerCallback:
    def __init__(self, metric_key, accumulation_steps=1, grad_clip_fn=None):
        self.metric_key = metric_key
        self.accumulation_steps = accumulation_steps
        self.grad_clip_fn = grad_clip_fn
        self._accumulation_counter = 0

    def on_batch_end(self, runner):
        if runner.is_train_loader:
            self._accumulation_counter += 1
            need_gradient_step = self._accumulation_counter % self.accumulation_steps == 0
            loss = runner.batch_metrics[self.metric_key]
            runner.engine.backward_loss(loss, runner.model, runner.optimizer)
            if self.grad_clip_fn is not None:
                self.grad_clip_fn(runner.model.parameters())  # BUG
            if need_gradient_step:
                runner.engine.optimizer_step(loss, runner.model, runner.optimizer)
                runner.engine.zero_grad(loss, runner.model, runner.optimizer)


class SupervisedRunner:
    def __init__(self, model, optimizer, engine, callbacks):
        self.model, self.optimizer, self.engine, self.callbacks = model, optimizer, engine, callbacks
        self.is_train_loader = True
        self.batch_metrics = {}

    def handle_batch(self, batch):
        x, y = batch
        with self.engine.autocast():
            logits = self.model(x)
        self.batch_metrics = {"loss": F.cross_entropy(logits.float(), y)}

    def train(self, loaders, num_epochs):
        for epoch in range(num_epochs):
            self.model.train()
            for batch in loaders["train"]:
                self.handle_batch(batch)
                for callback in self.callbacks:
                    callback.on_batch_end(self)
            print("epoch", epoch, "loss", round(self.batch_metrics["loss"].item(), 4))


model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loaders = {"train": [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(12)]}
clip = functools.partial(torch.nn.utils.clip_grad_norm_, max_norm=1.0)
runner = SupervisedRunner(model, optimizer, AMPEngine(), [OptimizerCallback("loss", accumulation_steps=2, grad_clip_fn=clip)])
runner.train(loaders, num_epochs=4)

# Source: https://github.com/rwth-i6/returnn/pull/1595
# Original: rwth-i6/returnn returnn/torch/updater.py (Updater.step) and returnn/torch/engine.py (train_step)
# Bug: with AMP the engine backpropagates the GradScaler-scaled loss and the updater clips the gradient norm before
# the scaler unscales, so the clipping threshold is in effect divided by the loss scale.
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Updater:
    def __init__(self, model, learning_rate, gradient_clip_global_norm):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
        self.gradient_clip_global_norm = gradient_clip_global_norm

    def step(self, grad_scaler=None):
        if self.gradient_clip_global_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.gradient_clip_global_norm)  # BUG
        if grad_scaler is not None:
            grad_scaler.step(self.optimizer)
            grad_scaler.update()
        else:
            self.optimizer.step()


class Engine:
    def __init__(self, model):
        self.model = model
        self.updater = Updater(model, learning_rate=1e-3, gradient_clip_global_norm=1.0)
        self.grad_scaler = torch.amp.GradScaler("cpu")

    def train_step(self, features, targets):
        self.updater.optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            logits = self.model(features)
        loss = F.cross_entropy(logits.float(), targets)
        self.grad_scaler.scale(loss).backward()
        self.updater.step(grad_scaler=self.grad_scaler)
        return loss.item()


model = torch.nn.Sequential(torch.nn.Linear(40, 96), torch.nn.ReLU(), torch.nn.Linear(96, 30))
engine = Engine(model)
for step in range(40):
    loss = engine.train_step(torch.randn(16, 40), torch.randint(0, 30, (16,)))
    if step % 10 == 0:
        print("step", step, "loss", round(loss, 4))

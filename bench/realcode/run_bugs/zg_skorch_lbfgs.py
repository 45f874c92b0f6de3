# Source: https://github.com/skorch-dev/skorch/issues/636
# Original: skorch-dev/skorch skorch/net.py (NeuralNet.train_step / train_step_single), skorch 0.8
# Bug: zero_grad moved out of train_step_single (the body of the step closure) into train_step, before
# optimizer.step(step_fn); LBFGS evaluates the closure several times per step, so each re-evaluation's
# backward adds its gradient to those of the evaluations before it (the report: nan losses under LBFGS).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class NeuralNetRegressor:
    def __init__(self, module, lr=0.3, max_iter=6):
        self.module_ = module
        self.optimizer_ = torch.optim.LBFGS(module.parameters(), lr=lr, max_iter=max_iter)
        self.history = []

    def get_loss(self, y_pred, y_true):
        return F.mse_loss(y_pred, y_true)

    def train_step_single(self, Xi, yi):
        self.module_.train()
        y_pred = self.module_(Xi)
        loss = self.get_loss(y_pred, yi)
        loss.backward()  # BUG
        return {"loss": loss, "y_pred": y_pred}

    def train_step(self, Xi, yi):
        step_accumulator = []

        def step_fn():
            step = self.train_step_single(Xi, yi)
            step_accumulator.append(step)
            return step["loss"]

        self.optimizer_.zero_grad()
        self.optimizer_.step(step_fn)
        return step_accumulator[-1]

    def fit(self, X, y, max_epochs, batch_size=64):
        for epoch in range(max_epochs):
            losses = []
            for start in range(0, len(X), batch_size):
                step = self.train_step(X[start:start + batch_size], y[start:start + batch_size])
                losses.append(step["loss"].item())
            self.history.append(sum(losses) / len(losses))
            print(f"epoch {epoch} train_loss {self.history[-1]:.4f}")
        return self


X = torch.randn(256, 10)
y = (X[:, :3].sum(1, keepdim=True) + 0.1 * torch.randn(256, 1))
module = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
NeuralNetRegressor(module).fit(X, y, max_epochs=6)

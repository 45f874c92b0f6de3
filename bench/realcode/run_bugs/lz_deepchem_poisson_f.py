# Source: https://github.com/deepchem/deepchem/issues/5099
# Original: deepchem/deepchem deepchem/models/losses.py (Loss, PoissonLoss._create_pytorch_loss) and
# deepchem/models/torch_models/torch_model.py (TorchModel.fit_generator, _StandardLoss)
# Bug: PoissonLoss's PyTorch path computes mean(output - labels * log(output)) on the raw model output with no epsilon
# guard (sibling losses in the same file clamp); a count model whose ReLU output reaches exactly 0 gets log(0) = -inf,
# 0 * -inf = nan for zero counts, and nan gradients from then on (the repro; the open PRs clamp to finfo.eps).
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)


class Loss:
    def _create_pytorch_loss(self):
        raise NotImplementedError


class PoissonLoss(Loss):
    """The negative Poisson log likelihood, for an output that is the predicted mean count."""

    def _create_pytorch_loss(self):
        def loss(output, labels):
            return torch.mean(output - labels * torch.log(output))  # BUG
        return loss


class _StandardLoss:
    def __init__(self, model, loss):
        self.model, self.loss = model, loss
        self.criterion = loss._create_pytorch_loss()

    def __call__(self, outputs, labels, weights):
        losses = self.criterion(outputs[0], labels[0])
        w = weights[0]
        return (losses * w).mean() if w is not None else losses


class NumpyDataset:
    def __init__(self, X, y):
        self.X, self.y = X, y

    def iterbatches(self, batch_size, deterministic=False):
        order = np.arange(len(self.X)) if deterministic else np.random.permutation(len(self.X))
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            yield self.X[idx], self.y[idx], None


class TorchModel:
    def __init__(self, model, loss, batch_size=32, learning_rate=3e-3):
        self.model, self.batch_size = model, batch_size
        self._loss_fn = _StandardLoss(model, loss)
        self._pytorch_optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    def fit(self, dataset, nb_epoch=10):
        avg_loss, averaged_batches = 0.0, 0
        for epoch in range(nb_epoch):
            for X_b, y_b, w_b in dataset.iterbatches(self.batch_size):
                inputs = torch.as_tensor(X_b, dtype=torch.float32)
                labels = [torch.as_tensor(y_b, dtype=torch.float32)]
                self._pytorch_optimizer.zero_grad()
                outputs = [self.model(inputs)]
                batch_loss = self._loss_fn(outputs, labels, [w_b])
                batch_loss.backward()
                self._pytorch_optimizer.step()
                avg_loss += batch_loss.item()
                averaged_batches += 1
            print(f"Ending global_step {epoch}: Average loss {avg_loss / averaged_batches:.4f}")
            avg_loss, averaged_batches = 0.0, 0
        return avg_loss


rng = np.random.default_rng(0)
X = rng.normal(size=(512, 12)).astype(np.float32)
rate = np.exp(0.6 * X[:, :3].sum(1, keepdims=True) - 0.5)
y = rng.poisson(rate).astype(np.float32)  # counts, about half of them 0
net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1), nn.ReLU())
TorchModel(net, PoissonLoss()).fit(NumpyDataset(X, y), nb_epoch=6)

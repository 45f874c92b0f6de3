"""Source: https://github.com/cgpotts/cs224u/commit/1f8932415d4361497076f566049a1b60f178345f
("Proper handling of the optimizer for warm starts")
Original: cgpotts/cs224u torch_shallow_neural_classifier.py (TorchShallowNeuralClassifier.fit) and
torch_model_base.py (TorchModelBase), read at 1f89324^.
Bug: with warm_start=True a second call of fit() keeps the trained model ("resume training with previously
defined trainable parameters", as the docstring says) but builds a brand-new optimizer on every call, so Adam's
moments and step counts are thrown away and the resumed training restarts the optimizer from scratch. The fix
creates self.opt together with the model and reuses it on warm starts.
Theirs: TorchModelBase's constructor and defaults (Adam, eta, l2_strength, warm_start), fit's data prep, the
`if not self.warm_start or not hasattr(self, "model")` graph reuse, the epoch loop with err.item() bookkeeping,
progress_bar, predict_proba/predict.
Ours: random two-class data in two halves, fit called twice (the second a warm start), smaller batch_size and
max_iter, CPU device.
"""
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.utils.data

torch.manual_seed(0)


def progress_bar(msg):
    """Simple over-writing progress bar."""
    sys.stderr.write('\r')
    sys.stderr.write(msg)
    sys.stderr.flush()


class TorchModelBase:
    def __init__(self, hidden_dim=50, hidden_activation=nn.Tanh(), batch_size=1028, max_iter=100, eta=0.01,
                 optimizer=torch.optim.Adam, l2_strength=0, warm_start=False, device=None):
        self.hidden_dim = hidden_dim
        self.hidden_activation = hidden_activation
        self.batch_size = batch_size
        self.max_iter = max_iter
        self.eta = eta
        self.optimizer = optimizer
        self.l2_strength = l2_strength
        self.warm_start = warm_start
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.params = ['hidden_dim', 'hidden_activation', 'batch_size', 'max_iter', 'eta', 'optimizer',
                       'l2_strength']
        self.errors = []
        self.dev_predictions = {}


class TorchShallowNeuralClassifier(TorchModelBase):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def define_graph(self):
        return nn.Sequential(
            nn.Linear(self.input_dim, self.hidden_dim),
            self.hidden_activation,
            nn.Linear(self.hidden_dim, self.n_classes_))

    def fit(self, X, y, **kwargs):
        # Incremental performance:
        X_dev = kwargs.get('X_dev')
        if X_dev is not None:
            dev_iter = kwargs.get('dev_iter', 10)
        # Data prep:
        X = np.array(X)
        self.input_dim = X.shape[1]
        self.classes_ = sorted(set(y))
        self.n_classes_ = len(self.classes_)
        class2index = dict(zip(self.classes_, range(self.n_classes_)))
        y = [class2index[label] for label in y]
        # Dataset:
        X = torch.tensor(X, dtype=torch.float)
        y = torch.tensor(y, dtype=torch.long)
        dataset = torch.utils.data.TensorDataset(X, y)
        dataloader = torch.utils.data.DataLoader(dataset, batch_size=self.batch_size, shuffle=True)
        # Graph:
        if not self.warm_start or not hasattr(self, "model"):
            self.model = self.define_graph()
        self.model.to(self.device)
        self.model.train()
        # Optimization:
        loss = nn.CrossEntropyLoss()
        optimizer = self.optimizer(  # BUG
            self.model.parameters(),
            lr=self.eta,
            weight_decay=self.l2_strength)
        # Train:
        for iteration in range(1, self.max_iter + 1):
            epoch_error = 0.0
            for X_batch, y_batch in dataloader:
                X_batch = X_batch.to(self.device, non_blocking=True)
                y_batch = y_batch.to(self.device, non_blocking=True)
                batch_preds = self.model(X_batch)
                err = loss(batch_preds, y_batch)
                epoch_error += err.item()
                optimizer.zero_grad()
                err.backward()
                optimizer.step()
            # Incremental predictions where possible:
            if X_dev is not None and iteration > 0 and iteration % dev_iter == 0:
                self.dev_predictions[iteration] = self.predict(X_dev)
                self.model.train()
            self.errors.append(epoch_error)
            progress_bar(f"Finished epoch {iteration} of {self.max_iter}; error is {epoch_error}")
        return self

    def predict_proba(self, X):
        self.model.eval()
        with torch.no_grad():
            self.model.to(self.device)
            X = torch.tensor(X, dtype=torch.float).to(self.device)
            preds = self.model(X)
            return torch.softmax(preds, dim=1).cpu().numpy()

    def predict(self, X):
        probs = self.predict_proba(X)
        return [self.classes_[i] for i in probs.argmax(axis=1)]


if __name__ == "__main__":
    rng = np.random.RandomState(0)
    X = rng.normal(size=(512, 20))
    w = rng.normal(size=20)
    y = ["pos" if v > 0 else "neg" for v in X @ w + 0.3 * rng.normal(size=512)]
    mod = TorchShallowNeuralClassifier(batch_size=64, max_iter=8, warm_start=True, device="cpu")
    mod.fit(X[:256], y[:256])
    # More data arrives: continue training the same model (warm start).
    mod.fit(X[256:], y[256:])
    acc = np.mean(np.array(mod.predict(X)) == np.array(y))
    print("\naccuracy", round(float(acc), 3))

# Source: https://github.com/havakv/torchtuples/pull/9 (fix commit fbf9e1a)
# Original: havakv/torchtuples torchtuples/base.py (Model.fit_dataloader, Model.predict_dataloader), at fbf9e1a^
# Bug: predict_dataloader(eval_=True) switches the net to eval mode before predicting and calls self.net.eval() again
# afterwards where self.net.train() was meant; a callback that predicts on a validation set at each epoch end leaves
# every later training epoch running with dropout off and batch norm on its running statistics (fix: .train()).
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class Callback:
    def give_model(self, model):
        self.model = model

    def on_epoch_start(self):
        return False

    def on_epoch_end(self):
        return False


class CallbackHandler:
    def __init__(self, callbacks, model):
        self.callbacks = callbacks
        for c in callbacks:
            c.give_model(model)

    def on_epoch_start(self):
        return any([c.on_epoch_start() for c in self.callbacks])

    def on_epoch_end(self):
        return any([c.on_epoch_end() for c in self.callbacks])


class Model:
    def __init__(self, net, loss, optimizer):
        self.net, self.loss, self.optimizer = net, loss, optimizer

    def compute_metrics(self, input, target):
        out = self.net(input)
        return {"loss": self.loss(out, target)}

    def fit_dataloader(self, dataloader, epochs=1, callbacks=None, verbose=True):
        self.callbacks = CallbackHandler(callbacks or [], self)
        stop = False
        for epoch in range(epochs):
            if stop:
                break
            stop = self.callbacks.on_epoch_start()
            running = 0.0
            for input, target in dataloader:
                self.optimizer.zero_grad()
                self.batch_metrics = self.compute_metrics(input, target)
                self.batch_loss = self.batch_metrics["loss"]
                self.batch_loss.backward()
                self.optimizer.step()
                running += self.batch_loss.item()
            else:
                stop = self.callbacks.on_epoch_end()
            if verbose:
                print(f"{epoch}:\t[loss: {running / len(dataloader):.4f}]")
        return self

    def predict_dataloader(self, dataloader, numpy=True, eval_=True, grads=False):
        if eval_:
            self.net.eval()
        with torch.set_grad_enabled(grads):
            preds = []
            for input in dataloader:
                preds.append(self.net(input[0]))
        if eval_:
            self.net.eval()  # BUG
        preds = torch.cat(preds)
        return preds.numpy() if numpy else preds


class ValAccuracy(Callback):
    """Accuracy on a held-out set at each epoch end, through the model's own predict."""

    def __init__(self, x_val, y_val):
        self.loader = DataLoader(TensorDataset(x_val), batch_size=64)
        self.y_val = y_val

    def on_epoch_end(self):
        preds = self.model.predict_dataloader(self.loader, numpy=False)
        acc = (preds.argmax(1) == self.y_val).float().mean().item()
        print(f"\tval accuracy {acc:.3f}")
        return False


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    y = ((x[:, :5].sum(1) > 0).long() + (x[:, 5:10].sum(1) > 1).long())
    return x, y


x_train, y_train = make_data(1024, 0)
x_val, y_val = make_data(256, 1)
net = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 64),
                    nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 3))
model = Model(net, F.cross_entropy, torch.optim.Adam(net.parameters(), lr=1e-3))
loader = DataLoader(TensorDataset(x_train, y_train), batch_size=32, shuffle=True)
model.fit_dataloader(loader, epochs=6, callbacks=[ValAccuracy(x_val, y_val)])

# Source: https://github.com/lnccbrown/LANfactory/pull/120
# Original: lnccbrown/LANfactory src/lanfactory/trainers/torch_mlp.py (ModelTrainerTorchMLP.train_and_evaluate)
# Bug: the epoch loop turns the loss into a Python number with float(loss) on every training step for its running
# average, which blocks the host on the device each step; the PR accumulates the loss on the device and reads it
# once per epoch.
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class TorchMLP(torch.nn.Module):
    def __init__(self, input_shape=7, layer_sizes=(100, 100, 100, 1)):
        super().__init__()
        layers, width = [], input_shape
        for size in layer_sizes[:-1]:
            layers += [torch.nn.Linear(width, size), torch.nn.Tanh()]
            width = size
        layers.append(torch.nn.Linear(width, layer_sizes[-1]))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class ModelTrainerTorchMLP:
    def __init__(self, model, train_dl, valid_dl, n_epochs=4, learning_rate=1e-3):
        self.model, self.train_dl, self.valid_dl = model, train_dl, valid_dl
        self.n_epochs = n_epochs
        self.optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer, factor=0.1, patience=2)
        self.loss_fun = F.huber_loss

    def train_and_evaluate(self):
        for epoch in range(self.n_epochs):
            self.model.train()
            running_loss = 0.0
            for xb, yb in self.train_dl:
                pred = self.model(xb)
                loss = self.loss_fun(pred.squeeze(), yb.squeeze())
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                running_loss += float(loss)  # BUG
            self.model.eval()
            with torch.no_grad():
                val_loss = sum(self.loss_fun(self.model(xb).squeeze(), yb.squeeze()) for xb, yb in self.valid_dl)
            self.scheduler.step(val_loss)
            print(f"epoch {epoch} train {running_loss / len(self.train_dl):.4f} valid {float(val_loss):.4f}")


train = TensorDataset(torch.randn(2048, 7), torch.randn(2048, 1))
valid = TensorDataset(torch.randn(256, 7), torch.randn(256, 1))
trainer = ModelTrainerTorchMLP(TorchMLP(), DataLoader(train, batch_size=64, shuffle=True), DataLoader(valid, batch_size=256))
trainer.train_and_evaluate()

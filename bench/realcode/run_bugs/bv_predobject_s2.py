# Synthetic: state 2 of run14 (written for torchdoctor's dev set, no public source of its own)
# Bug: the model returns a small result object (not a tensor, tuple or dict); the validation loop was copied from
# the training loop and kept its backward and step, so the model trains on the validation batches in eval mode.
import torch
import torch.nn as nn

torch.manual_seed(0)


class Prediction:
    def __init__(self, value, log_var):
        self.value = value
        self.log_var = log_var

    def nll(self, target):
        return (0.5 * self.log_var + 0.5 * (target - self.value) ** 2 / self.log_var.exp()).mean()


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 2))

    def forward(self, x):
        out = self.net(x)
        return Prediction(out[:, :1], out[:, 1:])


reg = Regressor()
optim = torch.optim.Adam(reg.parameters(), lr=1e-3)
train = [(torch.randn(32, 6), torch.randn(32, 1)) for _ in range(12)]
valid = [(torch.randn(32, 6), torch.randn(32, 1)) for _ in range(3)]
for epoch in range(4):
    reg.train()
    for x, y in train:
        optim.zero_grad()
        loss = reg(x).nll(y)
        loss.backward()
        optim.step()
    reg.eval()
    total = 0.0
    for x, y in valid:
        optim.zero_grad()
        vloss = reg(x).nll(y)
        vloss.backward()  # BUG
        optim.step()
        total += vloss.item()
    print(f"epoch {epoch} val nll {total / len(valid):.4f}")

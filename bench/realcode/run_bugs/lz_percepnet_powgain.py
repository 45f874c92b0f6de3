# Source: https://github.com/jzi040941/PercepNet/issues/37
# Original: jzi040941/PercepNet rnn_train.py (CustomLoss and the training loop of the PercepNet GRU model); the
# 70-dimensional features and the band gains are synthetic, the model is one GRU with the two sigmoid heads
# Bug: the loss compares gains after a power compression, torch.pow(x, 0.5), of the predicted band gains gb_hat and
# of 1 - rb_hat, the predicted pitch-filter strength; once a sigmoid head saturates (rb_hat == 1.0 in float32 for
# the bands whose target strength is always 1), the derivative of x ** 0.5 at 0 is infinite, the backward turns it into NaN
# and the weights become NaN (the "loss = nan"; its fix keeps the compressed values away from 0).
import torch
from torch import nn


class PercepNet(nn.Module):
    def __init__(self, input_dim=70, hidden=64, bands=34):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(input_dim, hidden), nn.Tanh())
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.fc_gb = nn.Linear(hidden, bands)
        self.fc_rb = nn.Linear(hidden, bands)

    def forward(self, x):
        h, _ = self.gru(self.fc(x))
        return torch.sigmoid(self.fc_gb(h)), torch.sigmoid(self.fc_rb(h))


class CustomLoss(nn.Module):
    def __init__(self, gamma=0.5, c4=10.0):
        super().__init__()
        self.gamma, self.c4 = gamma, c4

    def forward(self, outputs, targets):
        gb_hat, rb_hat = outputs
        gb, rb = targets[..., :34], targets[..., 34:68]
        gain_err = torch.pow(gb, self.gamma) - torch.pow(gb_hat, self.gamma)
        strength_err = torch.pow(1 - rb, self.gamma) - torch.pow(1 - rb_hat, self.gamma)  # BUG
        return (torch.mean(gain_err ** 2) + self.c4 * torch.mean(gain_err ** 4)
                + torch.mean(strength_err ** 2))


torch.manual_seed(0)
model = PercepNet()
criterion = CustomLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=5e-2)
for epoch in range(8):
    running = 0.0
    for i in range(10):
        inputs = torch.randn(4, 20, 70)
        gains = torch.rand(4, 20, 34).clamp(min=0.05)
        voiced = (inputs[..., :1] > -0.5).float()
        strengths = torch.cat([voiced.expand(4, 20, 17), torch.ones(4, 20, 17)], dim=-1)
        targets = torch.cat([gains, strengths], dim=-1)
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()
        running += loss.item()
    print(f"epoch {epoch} loss {running / 10:.4f} rb max {outputs[1].max().item():.7f}")

# Source: https://github.com/NVIDIA/apex/issues/358
# Original: the reporter's custom binary focal criterion discussed in NVIDIA/apex #358 (ptrblck's reproduction)
# Bug: the criterion computes torch.log(y_pred) and torch.log(1 - y_pred) of sigmoid outputs that round to
# exactly 0 or 1, giving a NaN loss; the fix adds eps inside the log (or clamps y_pred).
import torch

torch.manual_seed(0)


class BinaryFocal(torch.nn.Module):
    def __init__(self, gamma=0.0):
        super().__init__()
        self.gamma = gamma

    def forward(self, y_pred, y_true):
        y_true = y_true.unsqueeze(1)
        y_pred = y_pred.unsqueeze(1)
        loss = torch.sum(y_true * torch.pow(1 - y_pred, self.gamma) * torch.log(y_pred)  # BUG
                         + (1 - y_true) * torch.pow(y_pred, self.gamma) * torch.log(1 - y_pred), dim=1)
        return -1.0 * loss.sum() / y_pred.size(0)


model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1), torch.nn.Flatten(0),
                            torch.nn.Sigmoid())
criterion = BinaryFocal()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    x = torch.randn(32, 12) * 50
    y = torch.randint(0, 2, (32,)).float()
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("loss", loss.item())

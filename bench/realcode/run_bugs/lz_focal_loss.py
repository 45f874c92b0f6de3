# Source: https://github.com/mathiaszinnen/focal_loss_torch/issues/3
# Original: mathiaszinnen/focal_loss_torch focal_loss/focal_loss.py (FocalLoss.forward)
# Bug: torch.log(p_t) of probabilities that reach exactly 0 (p_t = 1 - x with x == 1) gives inf/NaN losses;
# the fix adds an eps inside the log.
import torch

torch.manual_seed(0)


class FocalLoss(torch.nn.Module):
    def __init__(self, gamma=2.0):
        super().__init__()
        self.gamma = gamma

    def forward(self, x, target):
        # x: probabilities (the model ends in a softmax), target: class indices
        one_hot = torch.nn.functional.one_hot(target, x.shape[-1]).float()
        p_t = one_hot * x + (1 - one_hot) * (1 - x)
        loss = -((1 - p_t) ** self.gamma) * torch.log(p_t)  # BUG
        return loss.mean()


model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3), torch.nn.Softmax(-1))
criterion = FocalLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(60):
    x = torch.randn(16, 16) * 40  # unnormalised detector features: scores saturate
    y = torch.randint(0, 3, (16,))
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
print("loss", loss.item())

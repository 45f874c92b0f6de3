# Source: https://github.com/fcakyon/balanced-loss/pull/12
# Original: fcakyon/balanced-loss balanced_loss/losses.py (Loss.forward, class_balanced=True)
# Bug: the class-balanced weights are (1 - beta) / (1 - beta ** n_c); a class with no training samples
# has n_c = 0, so its effective number is 0 and its weight is inf; normalising the weights by their sum
# gives inf / inf = nan, and every loss built with them is nan from the first step.
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def focal_loss(logits, labels, alpha=None, gamma=2):
    bc_loss = F.binary_cross_entropy_with_logits(input=logits, target=labels, reduction="none")
    modulator = torch.exp(-gamma * labels * logits - gamma * torch.log(1 + torch.exp(-1.0 * logits)))
    loss = modulator * bc_loss
    total = torch.sum(alpha * loss) if alpha is not None else torch.sum(loss)
    return total / torch.sum(labels)


class Loss(torch.nn.Module):
    def __init__(self, loss_type="focal_loss", beta=0.999, fl_gamma=2, samples_per_class=None, class_balanced=False):
        super().__init__()
        self.loss_type, self.beta, self.fl_gamma = loss_type, beta, fl_gamma
        self.samples_per_class, self.class_balanced = samples_per_class, class_balanced

    def forward(self, logits, labels):
        batch_size, num_classes = logits.size(0), logits.size(1)
        labels_one_hot = F.one_hot(labels, num_classes).float()
        weights = None
        if self.class_balanced:
            effective_num = 1.0 - np.power(self.beta, self.samples_per_class)
            weights = (1.0 - self.beta) / np.array(effective_num)  # BUG
            weights = weights / np.sum(weights) * num_classes
            weights = torch.tensor(weights, device=logits.device).float()
            weights = weights.unsqueeze(0).repeat(batch_size, 1) * labels_one_hot
            weights = weights.sum(1).unsqueeze(1).repeat(1, num_classes)
        if self.loss_type == "focal_loss":
            return focal_loss(logits, labels_one_hot, alpha=weights, gamma=self.fl_gamma)
        return F.cross_entropy(input=logits, target=labels_one_hot, weight=weights)


torch.manual_seed(0)
num_classes = 6
x = torch.randn(320, 16)
y = (x[:, :num_classes].argmax(1) % 5)  # class 5 never occurs in the training data
samples_per_class = [int((y == c).sum()) for c in range(num_classes)]
print("samples per class:", samples_per_class)
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, num_classes))
criterion = Loss("focal_loss", beta=0.999, fl_gamma=2, samples_per_class=samples_per_class, class_balanced=True)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    for xb, yb in loader:
        loss = criterion(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")

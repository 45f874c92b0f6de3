# Source: https://github.com/Lightning-AI/torchmetrics/issues/1029 (fixed by https://github.com/Lightning-AI/torchmetrics/pull/1030)
# Original: Lightning-AI/torchmetrics torchmetrics/functional/regression/kl_divergence.py (_kld_update,
# _kld_compute, kl_divergence as of 0.8.2); from the issue and PR text; the distillation trainer is ours
# Bug: with probabilities (log_prob=False) the update computes sum(p * log(p / q)); a target distribution with exact
# zeros (one-hot labels, or a teacher whose softmax underflows) gives 0 * log(0) = 0 * -inf = NaN, so the loss is
# NaN from the first step and its backward writes NaN into every gradient.
import torch
import torch.nn.functional as F


def _kld_update(p, q, log_prob):
    total = p.shape[0]
    if log_prob:
        measures = torch.sum(p.exp() * (p - q), axis=-1)
    else:
        p = p / p.sum(axis=-1, keepdim=True)
        q = q / q.sum(axis=-1, keepdim=True)
        q = torch.clamp(q, torch.finfo(q.dtype).eps)
        measures = torch.sum(p * torch.log(p / q), axis=-1)  # BUG
    return measures, total


def _kld_compute(measures, total, reduction="mean"):
    if reduction == "sum":
        return measures.sum()
    if reduction == "mean":
        return measures.sum() / total
    return measures


def kl_divergence(p, q, log_prob=False, reduction="mean"):
    measures, total = _kld_update(p, q, log_prob)
    return _kld_compute(measures, total, reduction)


class DistillationLoss(torch.nn.Module):
    def __init__(self, alpha=0.5, temperature=2.0):
        super().__init__()
        self.alpha = alpha
        self.temperature = temperature

    def forward(self, student_logits, teacher_probs, labels):
        ce = F.cross_entropy(student_logits, labels)
        student_probs = F.softmax(student_logits / self.temperature, dim=-1)
        kd = kl_divergence(teacher_probs, student_probs)
        return (1 - self.alpha) * ce + self.alpha * kd * self.temperature**2


class Student(torch.nn.Module):
    def __init__(self, n_in=20, n_classes=6):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(n_in, 64), torch.nn.ReLU(), torch.nn.Linear(64, n_classes))

    def forward(self, x):
        return self.net(x)


def teacher_targets(x, labels, n_classes=6):
    # a saved teacher's sharpened probabilities: confident rows underflow to exact zeros
    logits = torch.randn(x.shape[0], n_classes) * 2 + F.one_hot(labels, n_classes) * 120
    return F.softmax(logits, dim=-1)


torch.manual_seed(0)
x_all = torch.randn(512, 20)
y_all = (x_all[:, :6].argmax(dim=1))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_all, y_all), batch_size=32, shuffle=True)
student = Student()
criterion = DistillationLoss()
optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9)
for epoch in range(3):
    for step, (x, y) in enumerate(loader):
        loss = criterion(student(x), teacher_targets(x, y), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")

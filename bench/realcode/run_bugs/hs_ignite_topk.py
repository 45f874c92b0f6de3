# Source: https://github.com/pytorch/ignite/issues/240
# Original: pytorch/ignite ignite/metrics/top_k_categorical_accuracy.py and ignite/metrics/loss.py (Metric.update)
# Bug: the running metrics call .item() in update(), once per training iteration, a host-device sync on every
# step; the fix keeps the sums as tensors and reads them in compute().
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class TopKCategoricalAccuracy:
    def __init__(self, k=5):
        self.k = k
        self.reset()

    def reset(self):
        self._num_correct, self._num_examples = 0, 0

    def update(self, output):
        y_pred, y = output
        sorted_indices = torch.topk(y_pred, self.k, dim=1)[1]
        correct = torch.sum(torch.eq(sorted_indices, y.view(-1, 1)), dim=1)
        self._num_correct += torch.sum(correct).item()  # BUG
        self._num_examples += correct.shape[0]

    def compute(self):
        return self._num_correct / self._num_examples


class RunningLoss:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def update(self, loss, n):
        self.total += loss.detach() * n
        self.count += n

    def compute(self):
        return float(self.total) / self.count


model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 20)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
topk, running = TopKCategoricalAccuracy(k=5), RunningLoss()
for epoch in range(3):
    topk.reset()
    for it in range(60):
        x, y = torch.randn(64, 32, device=device), torch.randint(0, 20, (64,), device=device)
        y_pred = model(x)
        loss = F.cross_entropy(y_pred, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        topk.update((y_pred.detach(), y))
        running.update(loss, x.size(0))
    print("epoch", epoch, "top5", round(topk.compute(), 3), "loss", round(running.compute(), 4))

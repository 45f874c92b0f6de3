# Source: https://github.com/horovod/horovod/pull/641
# Original: horovod/horovod examples/pytorch_imagenet_resnet50.py (Metric.update, train)
# Bug: the example's Metric class adds every batch's loss tensor, averaged across workers, to its running
# sum without detaching it; the sum (an attribute of the per-epoch Metric object) keeps the autograd graph of
# every step of the epoch alive, and memory grows until the epoch ends.
# Here a single process; allreduce stands in for hvd.allreduce, which is differentiable like Horovod's.
import torch
import torch.nn.functional as F

torch.manual_seed(0)
WORLD_SIZE = 1


def allreduce(tensor, name=None):
    return tensor / WORLD_SIZE


class Metric:
    def __init__(self, name):
        self.name = name
        self.sum = torch.tensor(0.)
        self.n = torch.tensor(0.)

    def update(self, val):
        self.sum += allreduce(val.cpu(), name=self.name)  # BUG
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


def accuracy(output, target):
    pred = output.max(1, keepdim=True)[1]
    return pred.eq(target.view_as(pred)).cpu().float().mean()


def adjust_learning_rate(epoch, batch_idx, warmup_epochs=2, base_lr=0.0125):
    if epoch < warmup_epochs:
        epoch += float(batch_idx + 1) / len(train_loader)
        lr_adj = 1. / WORLD_SIZE * (epoch * (WORLD_SIZE - 1) / warmup_epochs + 1)
    else:
        lr_adj = 1.
    for param_group in optimizer.param_groups:
        param_group["lr"] = base_lr * WORLD_SIZE * lr_adj


def train(epoch):
    model.train()
    train_loss = Metric("train_loss")
    train_accuracy = Metric("train_accuracy")
    for batch_idx, (data, target) in enumerate(train_loader):
        adjust_learning_rate(epoch, batch_idx)
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()
        train_loss.update(loss)
        train_accuracy.update(accuracy(output, target))
        postfix = {"loss": train_loss.avg.item(), "accuracy": 100. * train_accuracy.avg.item()}
    print("train epoch", epoch + 1, postfix)


def validate(epoch):
    model.eval()
    val_loss = Metric("val_loss")
    val_accuracy = Metric("val_accuracy")
    with torch.no_grad():
        for data, target in val_loader:
            output = model(data)
            val_loss.update(F.cross_entropy(output, target))
            val_accuracy.update(accuracy(output, target))
    print("validate epoch", epoch + 1, {"loss": val_loss.avg.item(), "accuracy": 100. * val_accuracy.avg.item()})


model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                            torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32),
                            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.0125, momentum=0.9, weight_decay=5e-5)
train_loader = [(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))) for _ in range(40)]
val_loader = [(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))) for _ in range(5)]
for epoch in range(3):
    train(epoch)
    validate(epoch)

# Source: https://github.com/freud14/poutyne/issues/12
# Original: freud14/poutyne poutyne/framework/model.py (Model._fit_batch)
# Bug: the framework's batch step zeroes the network's gradients (self.model.zero_grad()) instead of the
# optimizer's; parameters the optimizer holds outside the network, here the learnable task weights of the loss
# function, are never zeroed and their gradients pile up step after step (fixed: self.optimizer.zero_grad()).
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class UncertaintyWeightedLoss(torch.nn.Module):
    """Two-task loss with learned log-variances (Kendall et al.); its parameters live outside the network."""

    def __init__(self):
        super().__init__()
        self.log_vars = torch.nn.Parameter(torch.zeros(2))

    def forward(self, outputs, targets):
        reg, cls = outputs
        reg_loss = F.mse_loss(reg, targets[0])
        cls_loss = F.cross_entropy(cls, targets[1])
        return (torch.exp(-self.log_vars[0]) * reg_loss + self.log_vars[0]
                + torch.exp(-self.log_vars[1]) * cls_loss + self.log_vars[1])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU())
        self.reg = torch.nn.Linear(64, 1)
        self.cls = torch.nn.Linear(64, 4)

    def forward(self, x):
        h = self.body(x)
        return self.reg(h), self.cls(h)


class Model:
    def __init__(self, model, optimizer, loss_function):
        self.model, self.optimizer, self.loss_function = model, optimizer, loss_function

    def _fit_batch(self, x, y):
        self.model.zero_grad()
        pred_y = self.model(x)
        loss_tensor = self.loss_function(pred_y, y)
        loss_tensor.backward()  # BUG
        self.optimizer.step()
        return float(loss_tensor)

    def fit_generator(self, train_generator, epochs):
        self.model.train(True)
        for epoch in range(1, epochs + 1):
            losses = [self._fit_batch(x, y) for x, y in train_generator]
            print("epoch", epoch, "loss", round(sum(losses) / len(losses), 4))


def batches(n):
    out = []
    for _ in range(n):
        x = torch.randn(32, 20)
        out.append((x, (x[:, :1] * 2, (x[:, 1] > 0).long() + 2 * (x[:, 2] > 0).long())))
    return out


net, loss_function = Net(), UncertaintyWeightedLoss()
optimizer = torch.optim.SGD(list(net.parameters()) + list(loss_function.parameters()), lr=0.01, momentum=0.9)
Model(net, optimizer, loss_function).fit_generator(batches(20), epochs=4)

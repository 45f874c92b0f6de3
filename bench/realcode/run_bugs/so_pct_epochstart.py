# Source: https://github.com/Strawberry-Eat-Mango/PCT_Pytorch/issues/21
# Original: Strawberry-Eat-Mango/PCT_Pytorch main.py (train) and util.py (cal_loss), model.py (Pct, SA_Layer), at
# 15fb741
# Bug: scheduler.step() is the first statement of each epoch, before any opt.step(): torch warns that the first value
# of the schedule is skipped, every epoch trains at the next epoch's cosine LR and the last epoch already at eta_min
# (the reporter moved the call after the train_loader loop and the warning disappeared).
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import CosineAnnealingLR
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(1)


def cal_loss(pred, gold, smoothing=True):
    """Cross entropy with label smoothing."""
    gold = gold.contiguous().view(-1)
    if smoothing:
        eps = 0.2
        n_class = pred.size(1)
        one_hot = torch.zeros_like(pred).scatter(1, gold.view(-1, 1), 1)
        one_hot = one_hot * (1 - eps) + (1 - one_hot) * eps / (n_class - 1)
        log_prb = F.log_softmax(pred, dim=1)
        return -(one_hot * log_prb).sum(dim=1).mean()
    return F.cross_entropy(pred, gold, reduction="mean")


class SA_Layer(nn.Module):
    """Offset attention of the Point Cloud Transformer."""

    def __init__(self, channels):
        super().__init__()
        self.q_conv = nn.Conv1d(channels, channels // 4, 1, bias=False)
        self.k_conv = nn.Conv1d(channels, channels // 4, 1, bias=False)
        self.q_conv.weight = self.k_conv.weight
        self.v_conv = nn.Conv1d(channels, channels, 1)
        self.trans_conv = nn.Conv1d(channels, channels, 1)
        self.after_norm = nn.BatchNorm1d(channels)
        self.act = nn.ReLU()

    def forward(self, x):
        x_q = self.q_conv(x).permute(0, 2, 1)
        x_k = self.k_conv(x)
        x_v = self.v_conv(x)
        attention = F.softmax(torch.bmm(x_q, x_k), dim=-1)
        attention = attention / (1e-9 + attention.sum(dim=1, keepdims=True))
        x_r = torch.bmm(x_v, attention)
        x_r = self.act(self.after_norm(self.trans_conv(x - x_r)))
        return x + x_r


class Pct(nn.Module):
    def __init__(self, output_channels=3, dropout=0.5):
        super().__init__()
        self.conv1 = nn.Conv1d(3, 32, 1, bias=False)
        self.bn1 = nn.BatchNorm1d(32)
        self.sa1, self.sa2 = SA_Layer(32), SA_Layer(32)
        self.linear1 = nn.Linear(64, 64, bias=False)
        self.bn6 = nn.BatchNorm1d(64)
        self.dp1 = nn.Dropout(p=dropout)
        self.linear2 = nn.Linear(64, output_channels)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x1 = self.sa1(x)
        x2 = self.sa2(x1)
        x = torch.cat((x1, x2), dim=1).max(dim=-1)[0]
        x = self.dp1(F.leaky_relu(self.bn6(self.linear1(x)), negative_slope=0.2))
        return self.linear2(x)


def point_clouds(n, num_points=48, seed=0):
    """Points on a sphere, in a cube or on a cylinder, randomly scaled and jittered (classes 0, 1, 2)."""
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, 3, (n,), generator=g)
    p = torch.randn(n, num_points, 3, generator=g)
    sphere = p / p.norm(dim=-1, keepdim=True)
    cube = torch.rand(n, num_points, 3, generator=g) * 2 - 1
    ang = torch.rand(n, num_points, generator=g) * 6.283
    cyl = torch.stack([ang.cos(), ang.sin(), torch.rand(n, num_points, generator=g) * 2 - 1], -1)
    pts = torch.where(label[:, None, None] == 0, sphere, torch.where(label[:, None, None] == 1, cube, cyl))
    pts = pts * (0.6 + 0.8 * torch.rand(n, 1, 1, generator=g)) + 0.02 * torch.randn(n, num_points, 3, generator=g)
    return TensorDataset(pts, label[:, None])


def train(args):
    train_loader = DataLoader(point_clouds(192, seed=0), batch_size=args["batch_size"], shuffle=True, drop_last=True)
    test_loader = DataLoader(point_clouds(48, seed=1), batch_size=args["test_batch_size"], shuffle=True)
    model = nn.DataParallel(Pct())
    opt = optim.SGD(model.parameters(), lr=args["lr"] * 100, momentum=args["momentum"], weight_decay=5e-4)
    scheduler = CosineAnnealingLR(opt, args["epochs"], eta_min=args["lr"])
    criterion = cal_loss
    best_test_acc = 0
    for epoch in range(args["epochs"]):
        scheduler.step()  # BUG
        train_loss, count = 0.0, 0.0
        model.train()
        train_pred, train_true = [], []
        total_time = 0.0
        for data, label in train_loader:
            data, label = data, label.squeeze()
            data = data.permute(0, 2, 1)
            batch_size = data.size()[0]
            opt.zero_grad()
            start_time = time.time()
            logits = model(data)
            loss = criterion(logits, label)
            loss.backward()
            opt.step()
            total_time += time.time() - start_time
            preds = logits.max(dim=1)[1]
            count += batch_size
            train_loss += loss.item() * batch_size
            train_true.append(label.cpu().numpy())
            train_pred.append(preds.detach().cpu().numpy())
        train_true, train_pred = np.concatenate(train_true), np.concatenate(train_pred)
        print(f"Train {epoch}, loss: {train_loss / count:.6f}, train acc: "
              f"{(train_true == train_pred).mean():.6f}, lr {opt.param_groups[0]['lr']:.5f}")

        test_loss, count = 0.0, 0.0
        model.eval()
        test_pred, test_true = [], []
        with torch.no_grad():
            for data, label in test_loader:
                data, label = data.permute(0, 2, 1), label.squeeze()
                logits = model(data)
                loss = criterion(logits, label)
                count += data.size()[0]
                test_loss += loss.item() * data.size()[0]
                test_true.append(label.cpu().numpy())
                test_pred.append(logits.max(dim=1)[1].cpu().numpy())
        test_acc = (np.concatenate(test_true) == np.concatenate(test_pred)).mean()
        print(f"Test {epoch}, loss: {test_loss / count:.6f}, test acc: {test_acc:.6f}")
        best_test_acc = max(best_test_acc, test_acc)


train({"batch_size": 32, "test_batch_size": 16, "epochs": 4, "lr": 0.0001, "momentum": 0.9})

"""Co-teaching on noisy labels whose loss sorts the per-sample losses on the host at every step.

Source: https://github.com/bhanML/Co-teaching/pull/5 ("Accelerate training by performing all loss ops
on the device")
Original: bhanML/Co-teaching loss.py (loss_coteaching, read at 49fa8e5) and main.py (train, the
alpha/beta plan, rate_schedule; read at 07a0f57).
Bug: loss_coteaching copies both per-sample loss vectors to the host (`loss.data.cpu()`) and sorts them
with numpy at every training step; the indices then go back to the device to select the small-loss
samples, so each step waits for the device twice. The PR (closed unmerged) moved the sort and the
selection to torch ops on the device.
Ours: random 28x28 images with 20 % flipped labels instead of MNIST, a small CNN, 2 short epochs; the
evaluation pass and the result file are left out. On a GPU the .cpu() is a device-to-host copy; here
it runs on the CPU when no GPU is present.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

torch.manual_seed(0)
np.random.seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
learning_rate = 0.001
n_epoch = 3
batch_size = 64
num_gradual = 2
forget_rate = 0.2
exponent = 1


def loss_coteaching(y_1, y_2, t, forget_rate, ind, noise_or_not):
    loss_1 = F.cross_entropy(y_1, t, reduction="none")
    ind_1_sorted = np.argsort(loss_1.data.cpu())  # BUG
    loss_1_sorted = loss_1[ind_1_sorted]

    loss_2 = F.cross_entropy(y_2, t, reduction="none")
    ind_2_sorted = np.argsort(loss_2.data.cpu())

    remember_rate = 1 - forget_rate
    num_remember = int(remember_rate * len(loss_1_sorted))

    pure_ratio_1 = np.sum(noise_or_not[ind[ind_1_sorted[:num_remember]]]) / float(num_remember)
    pure_ratio_2 = np.sum(noise_or_not[ind[ind_2_sorted[:num_remember]]]) / float(num_remember)

    ind_1_update = ind_1_sorted[:num_remember]
    ind_2_update = ind_2_sorted[:num_remember]
    # exchange
    loss_1_update = F.cross_entropy(y_1[ind_2_update], t[ind_2_update])
    loss_2_update = F.cross_entropy(y_2[ind_1_update], t[ind_1_update])

    return torch.sum(loss_1_update) / num_remember, torch.sum(loss_2_update) / num_remember, pure_ratio_1, pure_ratio_2


class NoisyMNIST(Dataset):
    def __init__(self, n, noise_rate=0.2):
        self.data = torch.randn(n, 1, 28, 28)
        clean = (self.data.mean((1, 2, 3)) > 0).long() + 2 * (self.data[:, 0, :14].mean((1, 2)) > 0).long()
        flip = torch.rand(n) < noise_rate
        self.labels = torch.where(flip, torch.randint(0, 10, (n,)), clean)
        self.noise_or_not = (self.labels == clean).numpy()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.data[index], self.labels[index], index


class CNN(nn.Module):
    def __init__(self, input_channel=1, n_outputs=10):
        super().__init__()
        self.c1 = nn.Conv2d(input_channel, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.bn2 = nn.BatchNorm2d(32)
        self.l_c1 = nn.Linear(32, n_outputs)

    def forward(self, x):
        h = F.max_pool2d(F.leaky_relu(self.bn1(self.c1(x)), 0.01), 2)
        h = F.max_pool2d(F.leaky_relu(self.bn2(self.c2(h)), 0.01), 2)
        h = F.avg_pool2d(h, kernel_size=h.size(2)).view(h.size(0), -1)
        return self.l_c1(h)


train_dataset = NoisyMNIST(512)
noise_or_not = train_dataset.noise_or_not
mom1 = 0.9
mom2 = 0.1
epoch_decay_start = 2
alpha_plan = [learning_rate] * n_epoch
beta1_plan = [mom1] * n_epoch
for i in range(epoch_decay_start, n_epoch):
    alpha_plan[i] = float(n_epoch - i) / (n_epoch - epoch_decay_start) * learning_rate
    beta1_plan[i] = mom2


def adjust_learning_rate(optimizer, epoch):
    for param_group in optimizer.param_groups:
        param_group["lr"] = alpha_plan[epoch]
        param_group["betas"] = (beta1_plan[epoch], 0.999)


rate_schedule = np.ones(n_epoch) * forget_rate
rate_schedule[:num_gradual] = np.linspace(0, forget_rate ** exponent, num_gradual)


def train(train_loader, epoch, model1, optimizer1, model2, optimizer2):
    pure_ratio_1_list = []
    pure_ratio_2_list = []
    for i, (images, labels, indexes) in enumerate(train_loader):
        ind = indexes.cpu().numpy().transpose()
        images = images.to(device)
        labels = labels.to(device)

        logits1 = model1(images)
        logits2 = model2(images)
        loss_1, loss_2, pure_ratio_1, pure_ratio_2 = loss_coteaching(logits1, logits2, labels, rate_schedule[epoch], ind, noise_or_not)
        pure_ratio_1_list.append(100 * pure_ratio_1)
        pure_ratio_2_list.append(100 * pure_ratio_2)

        optimizer1.zero_grad()
        loss_1.backward()
        optimizer1.step()
        optimizer2.zero_grad()
        loss_2.backward()
        optimizer2.step()
    return pure_ratio_1_list, pure_ratio_2_list


def main():
    train_loader = torch.utils.data.DataLoader(dataset=train_dataset, batch_size=batch_size, drop_last=True, shuffle=True)
    cnn1 = CNN().to(device)
    optimizer1 = torch.optim.Adam(cnn1.parameters(), lr=learning_rate)
    cnn2 = CNN().to(device)
    optimizer2 = torch.optim.Adam(cnn2.parameters(), lr=learning_rate)
    for epoch in range(1, n_epoch):
        cnn1.train()
        adjust_learning_rate(optimizer1, epoch)
        cnn2.train()
        adjust_learning_rate(optimizer2, epoch)
        pure_ratio_1_list, pure_ratio_2_list = train(train_loader, epoch, cnn1, optimizer1, cnn2, optimizer2)
        print(f"Epoch [{epoch + 1}/{n_epoch}] Pure Ratio 1 {sum(pure_ratio_1_list) / len(pure_ratio_1_list):.4f} %, "
              f"Pure Ratio 2 {sum(pure_ratio_2_list) / len(pure_ratio_2_list):.4f} %")


if __name__ == "__main__":
    main()

# Source: https://github.com/iKintosh/GaborNet/issues/30
# Original: iKintosh/GaborNet GaborNet/GaborLayer.py (GaborConv2d.forward / calculate_weights) and the package's
# sanity-check network (a GaborConv2d first layer, then ordinary conv and linear layers); images are synthetic
# Bug: calculate_weights() builds each Gabor kernel from the learnable freq/theta/sigma/psi and writes it into
# `self.conv_layer.weight.data[i, j]`; the write through .data leaves no graph, so the four Gabor parameters never
# receive a gradient ("their gradients will be None") and the filters stay as initialised.
import math

import torch
from torch import nn
from torch.nn import Conv2d, Module, Parameter
from torch.nn import functional as F


class GaborConv2d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, padding=0):
        super().__init__()
        self.is_calculated = False
        self.conv_layer = Conv2d(in_channels, out_channels, kernel_size, padding=padding, bias=False)
        self.kernel_size = self.conv_layer.kernel_size
        self.delta = 1e-3
        self.freq = Parameter((math.pi / 2) * math.sqrt(2) ** (-torch.randint(0, 5, (out_channels, in_channels))).float())
        self.theta = Parameter((math.pi / 8) * torch.randint(0, 8, (out_channels, in_channels)).float())
        self.sigma = Parameter(math.pi / self.freq.detach().clone())
        self.psi = Parameter(math.pi * torch.rand(out_channels, in_channels))
        x0 = math.ceil(self.kernel_size[0] / 2)
        y0 = math.ceil(self.kernel_size[1] / 2)
        y, x = torch.meshgrid(torch.linspace(-x0 + 1, x0 + 0, self.kernel_size[0]),
                              torch.linspace(-y0 + 1, y0 + 0, self.kernel_size[1]), indexing="ij")
        self.register_buffer("y", y)
        self.register_buffer("x", x)

    def forward(self, input_tensor):
        if self.training:
            self.calculate_weights()
            self.is_calculated = False
        if not self.training:
            if not self.is_calculated:
                self.calculate_weights()
                self.is_calculated = True
        return self.conv_layer(input_tensor)

    def calculate_weights(self):
        for i in range(self.conv_layer.out_channels):
            for j in range(self.conv_layer.in_channels):
                sigma = self.sigma[i, j].expand_as(self.y)
                freq = self.freq[i, j].expand_as(self.y)
                theta = self.theta[i, j].expand_as(self.y)
                psi = self.psi[i, j].expand_as(self.y)
                rotx = self.x * torch.cos(theta) + self.y * torch.sin(theta)
                roty = -self.x * torch.sin(theta) + self.y * torch.cos(theta)
                g = torch.exp(-0.5 * ((rotx ** 2 + roty ** 2) / (sigma + self.delta) ** 2))
                g = g * torch.cos(freq * rotx + psi)
                g = g / (2 * math.pi * sigma ** 2)
                self.conv_layer.weight.data[i, j] = g  # BUG


class GaborNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.g0 = GaborConv2d(in_channels=1, out_channels=6, kernel_size=(7, 7))
        self.c1 = nn.Conv2d(6, 12, kernel_size=(3, 3))
        self.fc1 = nn.Linear(12 * 4 * 4, 32)
        self.fc3 = nn.Linear(32, 2)

    def forward(self, x):
        x = F.leaky_relu(self.g0(x))
        x = nn.MaxPool2d(kernel_size=(2, 2))(x)
        x = F.leaky_relu(self.c1(x))
        x = nn.MaxPool2d(kernel_size=(2, 2))(x)
        x = F.leaky_relu(self.fc1(x.view(x.shape[0], -1)))
        return self.fc3(x)


torch.manual_seed(0)
net = GaborNN()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
for epoch in range(3):
    for i in range(12):
        labels = torch.randint(0, 2, (8,))
        stripes = torch.sin(torch.arange(28.0) * (0.5 + labels.float().view(-1, 1, 1, 1)))
        inputs = stripes.expand(8, 1, 28, 28) + 0.2 * torch.randn(8, 1, 28, 28)
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
    print(epoch, round(loss.item(), 4), "freq grad", net.g0.freq.grad, "sigma grad", net.g0.sigma.grad)

"""Label-graph multi-label classifier whose learned adjacency is detached before it is used.

Source: https://github.com/queenie88/A-GCN/issues/4 ("Question about gradient flow"; the maintainer
agreed the .detach() must go and updated the code)
Original: queenie88/A-GCN models__adapt.py (GCNResnet.forward, NONLocalBlock1D, GraphConvolution) and
engine__adapt.py (Engine.on_forward / train), read at 0ca6bd8 (models) and 65873b8 (engine);
gen_adj_new is the repository's degree normalisation.
Bug: the adjacency built by the non-local block from the label embeddings is normalised and then
detached, so neither the classification loss nor the adjacency loss (criterion2(adj, A)) reaches the
block's theta/phi convolutions: they are in the optimizer but never receive a gradient.
Ours: a small conv stack instead of ResNet-101, 16 labels with 32-d random label embeddings, random
images and multi-hot targets, CPU, the Engine reduced to its on_forward/train path (no meters, tqdm).
"""
import math

import torch
import torch.nn as nn
from torch.nn import Parameter

torch.manual_seed(0)
NUM_CLASSES = 16


class NONLocalBlock1D(nn.Module):
    def __init__(self, in_channels, inter_channels=None):
        super().__init__()
        self.in_channels = in_channels
        self.inter_channels = inter_channels

        if self.inter_channels is None:
            self.inter_channels = in_channels // 2
            if self.inter_channels == 0:
                self.inter_channels = 1

        self.theta = nn.Conv1d(in_channels=self.in_channels, out_channels=self.inter_channels,
                               kernel_size=1, stride=1, padding=0)
        self.phi = nn.Conv1d(in_channels=self.in_channels, out_channels=self.inter_channels,
                             kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        batch_size = x.size(0)
        theta_x = self.theta(x).view(batch_size, self.inter_channels, -1)
        theta_x = theta_x.squeeze(2)
        phi_x = self.phi(x).view(batch_size, self.inter_channels, -1)
        phi_x = phi_x.squeeze(2).transpose(0, 1)
        f = torch.matmul(theta_x, phi_x)
        N = f.size(-1)
        f_div_C = f / N
        return f_div_C


class GraphConvolution(nn.Module):
    def __init__(self, in_features, out_features, bias=False):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(torch.Tensor(in_features, out_features))
        if bias:
            self.bias = Parameter(torch.Tensor(1, 1, out_features))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1. / math.sqrt(self.weight.size(1))
        self.weight.data.uniform_(-stdv, stdv)
        if self.bias is not None:
            self.bias.data.uniform_(-stdv, stdv)

    def forward(self, input, adj):
        support = torch.matmul(input, self.weight)
        output = torch.matmul(adj, support)
        if self.bias is not None:
            return output + self.bias
        return output


def gen_adj_new(A):
    D = torch.pow(A.sum(1).float(), -0.5)
    D = torch.diag(D)
    adj = torch.matmul(D, torch.matmul(A, D))
    return adj


class GCNResnet(nn.Module):
    def __init__(self, num_classes, in_channel=32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 128, 3, stride=2, padding=1), nn.ReLU(),
        )
        self.num_classes = num_classes
        self.pooling = nn.MaxPool2d(8, 8)

        self.non_local_C1 = NONLocalBlock1D(in_channel)
        self.gc1 = GraphConvolution(in_channel, 64)
        self.gc2 = GraphConvolution(64, 128)
        self.activate = nn.LeakyReLU(0.2)

    def forward(self, feature, inp):
        feature = self.features(feature)
        feature = self.pooling(feature)
        feature = feature.view(feature.size(0), -1)
        inp = inp[0]
        inp1 = inp.unsqueeze(2)
        adj = self.non_local_C1(inp1)
        A1 = torch.eye(self.num_classes, self.num_classes).float()
        adj = adj + A1
        adj = gen_adj_new(adj).detach()  # BUG
        x = self.gc1(inp, adj)
        x = self.activate(x)
        x = self.gc2(x, adj)
        x = x.transpose(0, 1)
        x = torch.matmul(feature, x)
        A = A1.unsqueeze(0)
        adj = adj.unsqueeze(0)
        return x, adj, A

    def get_config_optim(self, lr, lrp):
        return [
            {"params": self.features.parameters(), "lr": lr * lrp},
            {"params": self.non_local_C1.parameters(), "lr": lr},
            {"params": self.gc1.parameters(), "lr": lr},
            {"params": self.gc2.parameters(), "lr": lr},
        ]


class Engine:
    def __init__(self, state):
        self.state = state

    def on_forward(self, training, model, criterion, criterion2, lamda, optimizer=None):
        feature_var, inp_var = self.state["input"]
        target_var = self.state["target"]
        self.state["output"], adj, A = model(feature_var, inp_var)
        self.state["loss"] = criterion(self.state["output"], target_var) + lamda * criterion2(adj, A)
        if training:
            optimizer.zero_grad()
            self.state["loss"].backward()
            optimizer.step()

    def train(self, data_loader, model, criterion, criterion2, lamda, optimizer, epoch):
        model.train()
        for i, (input, target) in enumerate(data_loader):
            self.state["iteration"] = i
            self.state["input"] = input
            self.state["target"] = target
            self.on_forward(True, model, criterion, criterion2, lamda, optimizer)
        print("Epoch: [{}]\tLoss {:.4f}".format(epoch, self.state["loss"].item()))


word_embeddings = torch.randn(1, NUM_CLASSES, 32) * 0.5
images = torch.randn(128, 3, 32, 32)
targets = (torch.rand(128, NUM_CLASSES) < 0.2).float()
loader = [((images[i:i + 16], word_embeddings), targets[i:i + 16]) for i in range(0, 128, 16)]

model = GCNResnet(NUM_CLASSES, in_channel=32)
criterion = nn.MultiLabelSoftMarginLoss()
criterion2 = nn.MSELoss()
optimizer = torch.optim.SGD(model.get_config_optim(0.1, 0.1), lr=0.1, momentum=0.9, weight_decay=1e-4)
engine = Engine({"max_epochs": 4})
for epoch in range(engine.state["max_epochs"]):
    engine.train(loader, model, criterion, criterion2, 0.1, optimizer, epoch)

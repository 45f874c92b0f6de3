# Source: https://github.com/WangXuhongCN/OCGNN/issues/7
# Original: WangXuhongCN/OCGNN optim/trainer.py (train) and utils/evaluate.py (fixed_graph_evaluate)
# Bug: model.train() is called once before the epoch loop; fixed_graph_evaluate(), called after every training step,
# puts the GCN in eval mode and never switches it back, so from the second epoch on the one-class GCN trains with
# its dropout turned off.
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
np.random.seed(0)


class GraphConv(nn.Module):
    """Dense stand-in for dgl's GraphConv: normalised adjacency times features times weight."""

    def __init__(self, in_feats, out_feats, activation=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_feats, out_feats))
        nn.init.xavier_uniform_(self.weight)
        self.activation = activation

    def forward(self, adj, h):
        h = adj @ (h @ self.weight)
        return self.activation(h) if self.activation is not None else h


class GCN(nn.Module):
    def __init__(self, in_feats, n_hidden, n_classes, n_layers, activation, dropout):
        super().__init__()
        self.layers = nn.ModuleList([GraphConv(in_feats, n_hidden, activation)])
        for _ in range(n_layers - 1):
            self.layers.append(GraphConv(n_hidden, n_hidden, activation))
        self.layers.append(GraphConv(n_hidden, n_classes))
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, adj, features):
        h = features
        for i, layer in enumerate(self.layers):
            if i != 0:
                h = self.dropout(h)
            h = layer(adj, h)
        return h


def anomaly_score(data_center, outputs, radius, mask):
    dist = torch.sum((outputs[mask] - data_center) ** 2, dim=1)
    return dist, dist - radius ** 2


def loss_function(nu, data_center, outputs, radius, mask):
    dist, scores = anomaly_score(data_center, outputs, radius, mask)
    loss = radius ** 2 + (1 / nu) * torch.mean(torch.clamp(scores, min=0))
    return loss, dist, scores


def init_center(adj, features, model, eps=0.001):
    model.eval()
    with torch.no_grad():
        outputs = model(adj, features)
    c = outputs.mean(dim=0)
    c[(c.abs() < eps) & (c < 0)] = -eps
    c[(c.abs() < eps) & (c >= 0)] = eps
    return c


def get_radius(dist, nu):
    return float(np.quantile(np.sqrt(dist.detach().numpy()), 1 - nu))


def auroc(labels, scores):
    order = np.argsort(scores)
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels == 1
    return (ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())


def fixed_graph_evaluate(nu, model, data_center, data, radius, mask):
    model.eval()
    with torch.no_grad():
        outputs = model(data["adj"], data["features"])
        _, scores = anomaly_score(data_center, outputs, radius, mask)
        loss, _, _ = loss_function(nu, data_center, outputs, radius, mask & data["labels"].bool())
    return auroc(data["labels"][mask].numpy(), scores.numpy()), loss


def make_graph(n=300, feats=32):
    labels = (torch.rand(n) < 0.1).long()  # 1 = anomaly
    features = torch.randn(n, feats)
    features[labels == 1] += 1.5 * torch.randn(feats)
    adj = (torch.rand(n, n) < 0.03).float()
    adj = ((adj + adj.t() + torch.eye(n)) > 0).float()
    deg = adj.sum(1)
    adj = adj / torch.sqrt(deg[:, None] * deg[None, :])
    perm = torch.randperm(n)
    train_mask = torch.zeros(n, dtype=torch.bool)
    val_mask = torch.zeros(n, dtype=torch.bool)
    train_mask[perm[:180]] = True
    val_mask[perm[180:]] = True
    train_mask &= labels == 0  # one-class training: normal nodes only
    return {"adj": adj, "features": features, "labels": labels, "train_mask": train_mask, "val_mask": val_mask}


def train(nu, n_epochs, data, model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=5e-4)
    data_center = init_center(data["adj"], data["features"], model)
    radius = torch.tensor(0.0)
    model.train()
    for epoch in range(n_epochs):
        outputs = model(data["adj"], data["features"])
        loss, dist, _ = loss_function(nu, data_center, outputs, radius, data["train_mask"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        radius.data = torch.tensor(get_radius(dist, nu))
        auc, val_loss = fixed_graph_evaluate(nu, model, data_center, data, radius, data["val_mask"])  # BUG
        if epoch % 10 == 0:
            print(f"Epoch {epoch:05d} | Train Loss {loss.item():.5f} | Val Loss {val_loss.item():.5f} | Val AUROC {auc:.4f}")
    return model


data = make_graph()
model = GCN(32, 64, 32, n_layers=2, activation=torch.relu, dropout=0.5)
train(nu=0.1, n_epochs=60, data=data, model=model)

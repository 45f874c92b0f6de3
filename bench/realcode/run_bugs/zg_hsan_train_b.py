# Source: https://github.com/yueliu1999/HSAN/issues/6
# Original: yueliu1999/HSAN train.py (the training loop), model.py (hard_sample_aware_network) and utils.py
# (laplacian_filtering, comprehensive_similarity, hard_sample_aware_infoNCE, high_confidence, pseudo_matrix), at 6c38810
# Bug: the training loop calls loss.backward() and optimizer.step() every epoch and never optimizer.zero_grad() (nor
# HSAN.zero_grad()): each step applies the sum of all earlier epochs' gradients ("The model is not converging").
import itertools

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim

TAO, BETA = 0.9, 2.0


class hard_sample_aware_network(nn.Module):
    def __init__(self, input_dim, hidden_dim, n_num):
        super().__init__()
        self.AE1 = nn.Linear(input_dim, hidden_dim)
        self.AE2 = nn.Linear(input_dim, hidden_dim)
        self.SE1 = nn.Linear(n_num, hidden_dim)
        self.SE2 = nn.Linear(n_num, hidden_dim)
        self.alpha = nn.Parameter(torch.tensor(0.99999))
        self.pos_weight = torch.ones(n_num * 2)
        self.pos_neg_weight = torch.ones([n_num * 2, n_num * 2])
        self.activate = lambda x: x

    def forward(self, x, A):
        Z1 = F.normalize(self.activate(self.AE1(x)), dim=1, p=2)
        Z2 = F.normalize(self.activate(self.AE2(x)), dim=1, p=2)
        E1 = F.normalize(self.SE1(A), dim=1, p=2)
        E2 = F.normalize(self.SE2(A), dim=1, p=2)
        return Z1, Z2, E1, E2


def load_graph_data(n_per=50, k=3, dim=40, seed=0):
    """A stochastic block model with k communities and community-dependent noisy features."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(k).repeat_interleave(n_per)
    p = torch.where(y[:, None] == y[None, :], 0.08, 0.03)
    A = (torch.rand(len(y), len(y), generator=g) < p).float().triu(1)
    A = A + A.T
    X = torch.randn(k, dim, generator=g)[y] * 0.25 + torch.randn(len(y), dim, generator=g)
    return X, y.numpy(), A, len(y), k


def laplacian_filtering(A, X, t):
    A_tmp = A + torch.eye(A.shape[0])
    d = A_tmp.sum(0)
    A_norm = A_tmp / torch.sqrt(d[:, None] * d[None, :])
    for _ in range(t):
        X = A_norm @ X
    return X.float()


def comprehensive_similarity(Z1, Z2, E1, E2, alpha):
    Z1_Z2 = torch.cat([torch.cat([Z1 @ Z1.T, Z1 @ Z2.T], dim=1), torch.cat([Z2 @ Z1.T, Z2 @ Z2.T], dim=1)], dim=0)
    E1_E2 = torch.cat([torch.cat([E1 @ E1.T, E1 @ E2.T], dim=1), torch.cat([E2 @ E1.T, E2 @ E2.T], dim=1)], dim=0)
    return alpha * Z1_Z2 + (1 - alpha) * E1_E2


def hard_sample_aware_infoNCE(S, M, pos_neg_weight, pos_weight, node_num):
    pos_neg = M * torch.exp(S * pos_neg_weight)
    pos = torch.cat([torch.diag(S, node_num), torch.diag(S, -node_num)], dim=0)
    pos = torch.exp(pos * pos_weight)
    neg = torch.sum(pos_neg, dim=1) - pos
    return (-torch.log(pos / (pos + neg))).sum() / (2 * node_num)


def kmeans(X, num_clusters, iters=20):
    center = X[torch.randperm(X.shape[0])[:num_clusters]]
    for _ in range(iters):
        labels = torch.cdist(X, center).argmin(1)
        center = torch.stack([X[labels == c].mean(0) if (labels == c).any() else center[c]
                              for c in range(num_clusters)])
    return labels, center


def phi(feature, true_labels, cluster_num):
    predict_labels, centers = kmeans(feature, cluster_num)
    pred = predict_labels.numpy()
    acc = max((np.array(perm)[pred] == true_labels).mean() for perm in itertools.permutations(range(cluster_num)))
    return 100 * acc, pred, centers


def high_confidence(Z, center):
    distance_norm = torch.min(F.softmax(torch.cdist(Z, center) ** 2, dim=1), dim=1).values
    value, _ = torch.topk(distance_norm, int(Z.shape[0] * (1 - TAO)))
    index = torch.where(distance_norm <= value[-1], torch.ones_like(distance_norm), torch.zeros_like(distance_norm))
    v1 = torch.nonzero(index).reshape(-1)
    H = torch.cat([v1, v1 + Z.shape[0]], dim=0)
    return H, np.ix_(H, H)


def pseudo_matrix(P, S, node_num):
    P = torch.tensor(P)
    P = torch.cat([P, P], dim=0)
    Q = (P == P.unsqueeze(1)).float()
    S_norm = (S - S.min()) / (S.max() - S.min())
    M_mat = torch.abs(Q - S_norm) ** BETA
    M = torch.cat([torch.diag(M_mat, node_num), torch.diag(M_mat, -node_num)], dim=0)
    return M, M_mat


torch.manual_seed(0)
np.random.seed(0)
X, y, A, node_num, cluster_num = load_graph_data()
X_filtered = laplacian_filtering(A, X, 2)
best_acc, _, _ = phi(X_filtered, y, cluster_num)
HSAN = hard_sample_aware_network(input_dim=X.shape[1], hidden_dim=64, n_num=node_num)
optimizer = optim.Adam(HSAN.parameters(), lr=1e-3)
mask = torch.ones([node_num * 2, node_num * 2]) - torch.eye(node_num * 2)
for epoch in range(60):
    HSAN.train()
    Z1, Z2, E1, E2 = HSAN(X_filtered, A)
    S = comprehensive_similarity(Z1, Z2, E1, E2, HSAN.alpha)
    loss = hard_sample_aware_infoNCE(S, mask, HSAN.pos_neg_weight, HSAN.pos_weight, node_num)

    # optimization
    loss.backward()  # BUG
    optimizer.step()

    if epoch % 10 == 0:
        HSAN.eval()
        with torch.no_grad():
            Z1, Z2, E1, E2 = HSAN(X_filtered, A)
            S = comprehensive_similarity(Z1, Z2, E1, E2, HSAN.alpha)
            Z = (Z1 + Z2) / 2
            acc, P, center = phi(Z, y, cluster_num)
            H, H_mat = high_confidence(Z, center)
            M, M_mat = pseudo_matrix(P, S, node_num)
            HSAN.pos_weight[H] = M[H].data
            HSAN.pos_neg_weight[H_mat] = M_mat[H_mat].data
        best_acc = max(best_acc, acc)
        print(f"epoch {epoch} loss {loss.item():.4f} acc {acc:.2f}")
print(f"Training complete, best acc {best_acc:.2f}")
